from nvshim.entry import main

main()
