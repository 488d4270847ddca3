"""The ``nvshim-runtime`` front: a POSIX sh script that keeps Python off the calls nvshim
does not act on.

An engine calls its runtime for every ``state``, ``kill``, ``delete``, ``start``... of
every container; starting Python for each costs more than runc itself. The front reads
the global flags (runc's table, from ``nvshim.runtime.args``) up to the command and:

- ``create``/``run``: reads the command's own flags as runc does to find the bundle and
  the container id, then has nvshim edit the bundle unless ``config.json`` is a regular
  file in which ``grep -F`` finds none of the words that could make nvshim edit it
  (``nvshim.policy.request_triggers``: ``NVIDIA_``, ``CUDA_VERSION``, the configured CDI
  kind and annotation prefixes, ``/dev/nvidia``, JSON escapes...). A spec that cannot ask
  for a GPU is left byte-identical by Python anyway, so it goes to the low-level runtime
  directly; so does a help request.
  One that may ask for a GPU goes to ``nvshim-runtimed`` through a slot
  (``nvshim.runtime.slots``: no interpreter at all), else to Python. One that cannot ask
  for a GPU but has an exec marker left for its id (a container nvshim prepared once,
  whose delete failed) goes to Python, which drops the stale marker;
- ``exec``: starts Python only when the container id has a marker (nvshim prepared it),
  or, without one, when the low-level runtime's state of it (under ``--root``: runc's
  ``state.json``, crun's ``config.json``) holds nvshim's ``nvshim.io/exec-env``
  annotation (``grep -F``): a marker lost with the cache directory must not let an exec
  escape the enforcement;
- ``delete`` of a container with a marker: runs the low-level runtime as its child and
  removes the marker (``rm``) once it deleted the container, unless nvshim-runtimed keeps
  its slots and the marker names a state root (the daemon sweeps it once the container
  is gone); other deletes are exec'd;
- anything else: execs the low-level runtime named in nvshim's cache (written by Python,
  ``nvshim.runtime.passthrough``, with the trigger words of the configuration); on a
  cache miss Python resolves it. A ``PATH`` with a relative entry never has a runtime
  in the cache (the look-up depends on the directory): such calls start Python, but a
  create or run that may ask for a GPU still goes to a slot.

Whatever it cannot classify (an unknown flag, ``--flag=BOOL`` forms, two bundle flags, not
exactly one container id, an odd id, no grep at ``/usr/bin/grep`` or ``/bin/grep``, a
grep error) goes to Python, which parses the whole line as runc does. Nothing is
compiled on the node.

Where nvshim carries a build of ``front.c`` for the machine (``nvshim.runtime.frontbin``),
``nvshim install`` writes that compiled front instead, filled with ``front_fields``: the
same decisions without a shell or any other process (tests/test_runtime_frontbin.py
runs the same command lines through both).
"""

from __future__ import annotations

from nvshim import __version__
from nvshim.defaults import DEFAULT_CONFIG
from nvshim.oci.modify import EXEC_ENV_ANNOTATION
from nvshim.runtime import FRONT_CACHE, MARKER_DIR
from nvshim.runtime.args import BOOL, COMMAND_FLAGS, GLOBAL_FLAGS, VALUE
from nvshim.runtime.slots import (
    ACCEPTED,
    ACK_WAIT,
    DECLINED,
    DONE,
    EXEC,
    EXIT,
    GO,
    NO,
    REPLY_FD,
    SLOTS,
    SPAWN,
    TIMEOUT,
)
from nvshim.trusted import DEFAULT_CACHE_DIR

# flags each front reads itself (help and version requests, the bundle), not from a table
_HELP = ("help", "h")
_GLOBAL_OWN = (*_HELP, "version", "v")
_CREATE_OWN = (*_HELP, "bundle", "b")


def sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _forms(names, suffix: str = "") -> str:
    """``-x|--x`` case patterns (Go's flag takes one or two dashes)."""
    return "|".join(f"{dash}{name}{suffix}" for name in sorted(names) for dash in ("-", "--"))


def _names(table: dict[str, int], kind: int, skip=()) -> list[str]:
    return [n for n, k in table.items() if k == kind and n not in skip]


def _create_cases() -> str:
    """The ``case`` arms for create's and run's own flags (run has a few more)."""
    create, run = COMMAND_FLAGS["create"], COMMAND_FLAGS["run"]
    skip = _CREATE_OWN
    run_only = {n: k for n, k in run.items() if n not in create}
    arms = [
        f"{_forms(_names(create, BOOL, skip))}) ;;",
        f"{_forms(_names(create, VALUE, skip))}) s=v ;;",
        f"{_forms(_names(create, VALUE, skip), '=*')}) ;;",
    ]
    if _names(run_only, VALUE):  # pragma: no cover - runc's run has none
        raise AssertionError("run-only flags with values: extend the front")
    arms.append(f'{_forms(_names(run_only, BOOL))}) [ "$cmd" = run ] || py "$@" ;;')
    return "\n        ".join(arms)


def _served(interpreter: str, lost_code: str) -> str:
    """The sh functions that have nvshim-runtimed serve a call through a slot
    (``nvshim.runtime.slots``, which describes the exchange and the checks)."""
    lost = f'exec {sh_quote(interpreter)} -IS -c {sh_quote(lost_code)} "$0" "$r" "$@"'
    mode_c = "d????[!w]??[!w]?"
    mode_a = f"{mode_c}|d????????[tT]"  # not writable by group or others, or sticky
    mode_s = "drwx------"
    return f"""# srv ARGS: the call served by nvshim-runtimed through one of its slots ($d,
# nvshim.runtime.slots) when it runs, its slots are this user's own and fds 4 to 7
# are free; returns when the daemon did not take the call (nothing was done): then
# Python does it
srv() {{
  [ -p "$d/0.r" ] && [ -d "/proc/$$/fd" ] && mine && tool sleep || return 0
  w=$x
  for i in 4 5 6 7; do [ -e "/proc/$$/fd/$i" ] && return 0; done
  set -C
  i=0 k=$(($$ % {SLOTS}))
  until own "$d/$k.r" && own "$d/$k.u" && {{ printf '%s\\n' "$$" >"$d/$k.c"; }} 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -lt {SLOTS} ] || {{ set +C; return 0; }}
    k=$(((k + 1) % {SLOTS}))
  done
  set +C
  {{ fifo {REPLY_FD} && fifo 6 && talk "$@" 2>&7 7>&-; }} 7>&2 2>/dev/null 4<>"$d/$k.r" \\
    {REPLY_FD}<"$d/$k.r" 4>&- 6<>"$d/$k.u"
}}
# own PATH: a FIFO of this user's (a first look; what counts is fifo, on the open file)
own() {{ [ -p "$1" ] && [ -O "$1" ]; }}
# fifo N: fd N, as opened, is a FIFO of this user's
fifo() {{ own "/proc/self/fd/$1"; }}
# mine: the slots $d are a directory (no symlink) of this user's, and one ls -dn (an
# lstat of each path: a symlink shows as one, whatever it is swapped with) shows every
# directory from / to $d root's, those above the cache directory not writable by group
# or others unless sticky (t), the cache directory not writable by group or others, the
# slots 0700 (a + ACL: refused)
mine() {{
  [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] && tool ls || return 1
  set -- "$d" "$c"; p=${{c%/*}}
  while [ -n "$p" ]; do set -- "$@" "$p"; p=${{p%/*}}; done
  set -f; IFS=$nl; set -- $(LC_ALL=C "$x" -dn -- "$@" / 2>/dev/null); unset IFS
  [ "$#" -gt 0 ] || {{ set +f; return 1; }}
  for l do row $l || {{ set +f; return 1; }}; done
  set +f
}}
# row FIELDS: one line of mine's ls
row() {{
  [ "$#" -eq 9 ] && [ "$3" = 0 ] || return 1
  m=${{1%.}}
  case $9 in
  "$d") case $m in {mode_s}) ;; *) return 1 ;; esac ;;
  "$c") case $m in {mode_c}) ;; *) return 1 ;; esac ;;
  *) case $m in {mode_a}) ;; *) return 1 ;; esac ;;
  esac
}}
# run ARGS: ARGS with this stderr (on fd 7): the shell's own "Killed" for a runtime killed
# by a signal goes to /dev/null (the worker says it, in one line)
run() {{ ( exec 2>&7 7>&-; exec "$@" ); }}
talk() {{
  printf '%s %s\\n' "$$" "$#" >&6
  # the daemon has {ACK_WAIT} s to take the call (a stopped or hung one: Python does it):
  # bash's read has a timeout; dash's and busybox's stops for a trapped signal, here the
  # SIGCHLD of a sleep's exit (killed once an answer came; it holds no FIFO); in another
  # shell a watchdog writes t, killed with its sleep once an answer came (a sleep a kill
  # missed, between its fork and p=, only sleeps out its time)
  if [ -n "${{BASH_VERSION-}}" ]; then
    IFS= read -r -t {ACK_WAIT} a <&{REPLY_FD} || a=
  elif [ /proc/$$/exe -ef /bin/dash ] || [ /proc/$$/exe -ef /bin/busybox ] ||
    [ /proc/$$/exe -ef /usr/bin/busybox ]; then
    trap : CHLD
    "$w" {ACK_WAIT} </dev/null >/dev/null 2>&1 {REPLY_FD}<&- 6>&- &
    q=$!
    IFS= read -r a <&{REPLY_FD} || a=
    trap - CHLD
    kill "$q" 2>/dev/null
  else
    (trap 'kill "$p" 2>/dev/null; exit 0' TERM
      "$w" {ACK_WAIT} >/dev/null & p=$!; wait "$p" && echo {TIMEOUT}
    ) </dev/null >"$d/$k.r" 2>/dev/null {REPLY_FD}<&- 6>&- &
    q=$!
    IFS= read -r a <&{REPLY_FD} || a=
    kill "$q" 2>/dev/null
  fi
  case $a in
  {ACCEPTED}) echo {GO} >&6 ;;
  {DECLINED}) echo {DONE} >&6; return 0 ;;
  ''|{TIMEOUT}) echo {NO} >&6; return 0 ;;  # no answer in time (or the daemon went)
  *) return 0 ;;
  esac
  r=
  while IFS= read -r a <&{REPLY_FD}; do
    case $a in
    {TIMEOUT}) ;;
    "{EXEC} "/*|"{EXEC} "./*) echo {DONE} >&6; exec "${{a#{EXEC} }}" "$@" {REPLY_FD}<&- 6>&- ;;
    "{SPAWN} "/*|"{SPAWN} "./*)
      r=${{a#{SPAWN} }}; run "$r" "$@" 7>&2 2>/dev/null {REPLY_FD}<&- 6>&-; echo "$?" >&6 ;;
    "{EXIT} "[0-9]*) echo {DONE} >&6; exit "${{a#{EXIT} }}" ;;
    *) break ;;
    esac
  done
  # the daemon lost the call it had taken: it fails; Python deletes what runc created
  [ -z "$r" ] || {lost} {REPLY_FD}<&- 6>&-
  echo 'nvshim-runtime: error: nvshim-runtimed stopped answering' >&2
  exit 1
}}
"""


def front_fields(
    interpreter: str,
    code: str,
    cache_dir: str | None = None,
    slots_name: str | None = None,
    lost_code: str = "",
) -> dict[str, str]:
    """What the compiled front (``nvshim.runtime.frontbin``) needs to make the decisions
    :func:`front_text` writes into the script, from the same tables and constants."""

    def words(table: dict[str, int], kind: int, skip=_HELP) -> str:
        return " ".join(sorted(_names(table, kind, skip)))

    create, run = COMMAND_FLAGS["create"], COMMAND_FLAGS["run"]
    return {
        "interpreter": interpreter,
        "code": code,
        "lost-code": lost_code,
        "cache-dir": cache_dir or DEFAULT_CACHE_DIR,
        "slots": slots_name or "",
        "config": DEFAULT_CONFIG,
        "version": __version__,
        "front-cache": FRONT_CACHE,
        "marker-dir": MARKER_DIR,
        "exec-env": '"' + EXEC_ENV_ANNOTATION,
        "global-bool": words(GLOBAL_FLAGS, BOOL, _GLOBAL_OWN),
        "global-value": words(GLOBAL_FLAGS, VALUE),
        "create-bool": words(create, BOOL, _CREATE_OWN),
        "create-value": words(create, VALUE, _CREATE_OWN),
        "run-bool": words({n: k for n, k in run.items() if n not in create}, BOOL),
        "exec-bool": words(COMMAND_FLAGS["exec"], BOOL),
        "exec-value": words(COMMAND_FLAGS["exec"], VALUE),
        "slot-count": str(SLOTS),
        "ack-wait": str(ACK_WAIT),
        "accepted": ACCEPTED,
        "declined": DECLINED,
        "exec": EXEC,
        "spawn": SPAWN,
        "exit": EXIT,
        "done": DONE,
        "go": GO,
        "no": NO,
        "timeout": TIMEOUT,
    }


def front_text(
    interpreter: str,
    code: str,
    cache_dir: str | None = None,
    slots_name: str | None = None,
    lost_code: str = "",
) -> str:
    """The script: ``interpreter -IS -c code $0 ARGS`` for what Python must see.
    ``cache_dir``: the default for ``NVSHIM_CACHE_DIR`` (nvshim's own when None).
    ``slots_name``: where in the cache directory nvshim-runtimed keeps its slots for
    a create or run that may ask for a GPU (``nvshim.runtime.slots``), and
    ``lost_code``: the Python that deletes a container the daemon lost after its create
    (``interpreter -IS -c lost_code $0 RUNTIME ARGS``); without them such calls go to
    Python."""
    default = cache_dir or DEFAULT_CACHE_DIR
    slots = f"d=$c/{slots_name}\n" if slots_name else ""
    swept = '[ -p "$d/0.r" ]' if slots_name else "false"
    served = _served(interpreter, lost_code) if slots_name else ""
    ask = 'srv "$@"; py "$@"' if slots_name else 'py "$@"'

    g_bool = _names(GLOBAL_FLAGS, BOOL, _GLOBAL_OWN)
    g_value = _names(GLOBAL_FLAGS, VALUE)
    e_bool = _names(COMMAND_FLAGS["exec"], BOOL, _HELP)
    e_value = _names(COMMAND_FLAGS["exec"], VALUE)
    return f"""#!/bin/sh
# nvshim-runtime, generated by nvshim (nvshim.runtime.front). A create or run whose
# config.json may ask for a GPU, an exec of a container nvshim prepared, and anything
# this script cannot classify start Python; every other call is exec'd into the
# low-level runtime.
py() {{ exec {sh_quote(interpreter)} -IS -c {sh_quote(code)} "$0" "$@"; }}
# tool NAME: x=/usr/bin/NAME, else /bin/NAME, if an executable file; false if neither is
tool() {{
  for x in "/usr/bin/$1" "/bin/$1"; do [ -f "$x" ] && [ -x "$x" ] && return 0; done
  return 1
}}
nl='
'
c=${{NVSHIM_CACHE_DIR:-{sh_quote(default)}}}
case $c in /*) ;; *) c={sh_quote(default)} ;; esac
{slots}s=g h= v= cmd= id= n=0 j= mk= sr=
for a do
  n=$((n + 1))
  case $s in
  g)
    case $a in
    --) s=c ;;
    {_forms(g_bool)}) ;;
    -root|--root) s=gr ;;
    -root=*|--root=*) sr=${{a#*=}} ;;
    {_forms(g_value)}) s=gv ;;
    {_forms(g_value, "=*")}) ;;
    -h|--h|-help|--help) h=1 ;;
    -v|--v) [ "$v" = l ] && py "$@"; v=s ;;
    -version|--version) [ "$v" = s ] && py "$@"; v=l ;;
    -?*) py "$@" ;;
    *) cmd=$a; break ;;
    esac ;;
  gv) s=g ;;
  gr) sr=$a; s=g ;;
  c) cmd=$a; break ;;
  esac
done
f=$c/{FRONT_CACHE}
cfg=${{NVSHIM_CONFIG:-{DEFAULT_CONFIG}}}
# safe: the cache directory $c and every directory above it are real directories (no
# symlink) of this user's (root's), named plainly: only root can change what $c leads
# to (the modes, which test cannot see, are checked by nvshim-runtimed at start, by
# Python before it writes here, and by mine before a slot is used)
safe() {{
  case $c in *[!A-Za-z0-9/._+@:-]*|*//*|*/|*/./*|*/.|*/../*|*/..) return 1 ;; esac
  p=$c
  while [ -n "$p" ]; do
    [ -d "$p" ] && [ ! -L "$p" ] && [ -O "$p" ] || return 1
    p=${{p%/*}}
  done
}}
[ -f "$f" ] && [ ! -L "$f" ] && safe || py "$@"
rt= t= l1= tw=
case $h$cmd in create|run) tw=1 ;; esac  # a create or run reads the trigger words too
# the cache as opened (fd 0 of this group): a regular file of this user's, newer than
# the configuration, checked and read through the one open file (byte by byte: the
# pairs come before the words, which other calls do not read)
{{
  [ -f /proc/self/fd/0 ] && [ -O /proc/self/fd/0 ] && {{ [ ! -e "$cfg" ] ||
    [ /proc/self/fd/0 -nt "$cfg" ]; }} && {{
    IFS= read -r l1; IFS= read -r l2; IFS= read -r l3
    while IFS= read -r p && [ -n "$p" ] && IFS= read -r r; do
      [ "$p" = "${{PATH-}}" ] && {{ rt=$r; [ -n "$tw" ] || break; }}
    done
    [ -z "$tw" ] || while IFS= read -r w && [ -n "$w" ]; do t=$t$w$nl; done
  }}
}} <"$f"
[ "$l1" = {sh_quote(f"nvshim {__version__}")} ] && [ "$l2" = "$cfg" ] || py "$@"
# only an absolute runtime: a PATH with a relative entry has no pair (passthrough.fixed)
case $rt in /*) [ -f "$rt" ] && [ -x "$rt" ] || rt= ;; *) rt= ;; esac
if [ -e "$cfg" ]; then
  [ "$l3" = present ] || py "$@"
else
  [ "$l3" = missing ] || py "$@"
fi
# pass: the call goes to the runtime (Python resolves a runtime the cache has not)
pass() {{
  [ -n "$rt" ] || py "$@"
  [ -z "$h" ] && [ "$v" ] && printf '%s\\n' {sh_quote(f"nvshim-runtime version {__version__}")}
}}
# labelled ID: the low-level runtime's state of container ID (under --root, else root's
# default: runc's state.json, crun's copy of config.json) may hold nvshim's exec-env
# annotation: nvshim prepared it though its marker is gone (a cache directory emptied
# under a running container); a grep that fails says yes: Python decides
labelled() {{
  case ${{rt##*/}} in
  crun) l=${{sr:-/run/crun}}/$1/config.json ;;
  *) l=${{sr:-/run/runc}}/$1/state.json ;;
  esac
  [ -f "$l" ] || return 1
  tool grep || return 0
  GREP_OPTIONS= LC_ALL=C "$x" -F -q -e {sh_quote('"' + EXEC_ENV_ANNOTATION)} -- "$l" \\
    </dev/null >/dev/null 2>&1
  [ "$?" -ne 1 ]
}}
# every command but these four is exec'd here: the shell never reads what follows
case $cmd in create|run|exec|delete) ;; *) pass "$@"; exec "$rt" "$@" ;; esac
if [ -z "$h" ]; then
  case $cmd in
  create|run)
    # runc moves these flags ahead of the id (nvshim.runtime.args); on a line it accepts,
    # reading them in order finds the same bundle and id
    [ "$v" ] && py "$@"
    s=o k=0 b= nb=0 np=0
    for a do
      k=$((k + 1))
      [ "$k" -le "$n" ] && continue
      case $s in
      o)
        case $a in
        --) s=p ;;
        -h|--h|-help|--help) h=1; break ;;
        -b|--b|-bundle|--bundle) s=b ;;
        -b=*|--b=*|-bundle=*|--bundle=*) b=${{a#*=}}; nb=$((nb + 1)) ;;
        {_create_cases()}
        -?*) py "$@" ;;
        *) id=$a; np=$((np + 1)) ;;
        esac ;;
      b) b=$a; nb=$((nb + 1)); s=o ;;
      v) s=o ;;
      p) id=$a; np=$((np + 1)) ;;
      esac
    done
    if [ -z "$h" ]; then
      case $s$nb$np in o01|o11|p01|p11) ;; *) py "$@" ;; esac
      case $id in .|..|*/*) py "$@" ;; esac
      [ -e "$c/{MARKER_DIR}/$id" ] && mk=1
      j=${{b:-.}}/config.json
    fi ;;
  exec)
    s=e k=0
    for a do
      k=$((k + 1))
      [ "$k" -le "$n" ] && continue
      case $s in
      e)
        case $a in
        --) s=i ;;
        {_forms(e_bool)}) ;;
        {_forms(e_value)}) s=ev ;;
        {_forms(e_value, "=*")}) ;;
        -h|--h|-help|--help) h=1; break ;;
        -?*) py "$@" ;;
        *) id=$a; break ;;
        esac ;;
      ev) s=e ;;
      i) id=$a; break ;;
      esac
    done
    if [ -z "$h" ] && [ -n "$id" ]; then
      case $id in .|..|*/*) py "$@" ;; esac
      [ -e "$c/{MARKER_DIR}/$id" ] && py "$@"
      labelled "$id" && py "$@"
    fi ;;
  delete)
    # a container nvshim prepared: its marker goes once runc deleted it, removed here
    # unless nvshim-runtimed keeps its slots and the marker names a state root: then
    # the delete is exec'd and the daemon sweeps the marker (nvshim.runtime.markers)
    k=0
    for a do
      k=$((k + 1))
      [ "$k" -le "$n" ] && continue
      case $a in
      -f|--f|-force|--force) ;;
      -?*) id=; break ;;
      *) [ -z "$id" ] || {{ id=; break; }}; id=$a ;;
      esac
    done
    case $id in
    ''|.|..|*/*) ;;
    *) m=$c/{MARKER_DIR}/$id; [ -e "$m" ] && {{ [ -s "$m" ] && {swept} || mk=1; }} ;;
    esac ;;
  esac
fi
[ -n "$j" ] || {{
  pass "$@"
  [ -n "$mk" ] || exec "$rt" "$@"
  "$rt" "$@"
  k=$?
  [ "$k" -ne 0 ] || ! tool rm || "$x" -f -- "$c/{MARKER_DIR}/$id"
  exit "$k"
}}
# a create or run from here on: the shell never reads this for other calls
# gpu FILE: true unless FILE is a regular file in which grep finds none of the words
# ($t, one a line) that could make nvshim edit it (nvshim.policy.request_triggers)
gpu() {{
  [ -f "$1" ] || return 0
  tool grep || return 0
  g=$x j=$1
  set -f; IFS=$nl; set -- $t; unset IFS; set +f
  [ "$#" -gt 0 ] || return 0
  k=$#
  while [ "$k" -gt 0 ]; do set -- "$@" -e "$1"; shift; k=$((k - 1)); done
  GREP_OPTIONS= LC_ALL=C "$g" -F -q "$@" -- "$j" </dev/null >/dev/null 2>&1
  [ "$?" -ne 1 ]
}}
{served}gpu "$j" && {{ {ask}; }}
# a stale marker (a deleted container's, not removed): Python drops it
[ -z "$mk" ] && [ -n "$rt" ] || py "$@"
exec "$rt" "$@"
"""
