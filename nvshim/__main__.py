from nvshim.cli import main

main()
