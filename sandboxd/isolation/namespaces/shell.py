"""The namespace steps without the exec helper: ``unshare(1)`` at create, ``nsenter`` at exec.

Used where the helper was not built (the shell chain of :mod:`sandboxd.isolation.exec.wrapper`).
``unshare --ipc=PIN --mount=PIN --net=PIN --propagation=slave`` makes and pins the namespaces
(its own child binds ``/proc/PID/ns/*`` from the host's side); inside, :data:`SETUP` does what
the helper's ``namespaces`` mode does (``sandboxd_exec_ns.h``): detach the copy of the pins'
directory, bind the sandbox's ``tmp/`` onto ``/tmp`` and ``/var/tmp`` (through a descriptor
opened before either is covered), a tmpfs on ``/dev/shm``, a fresh mqueue, a root-owned tmpfs
on ``/home`` with the workspace (descriptor 8) bound onto ``/home/user``, the kept directories
bound back (descriptors 3 to 7: ``sh`` redirects one digit; :func:`kept_directories` gives one
per path kept, two at most), the sandbox's ``passwd`` and ``group`` (beside its pins, reached
through the directory under the detached mount) bound over ``/etc``'s, and the loopback up.
``private_run`` and ``private_dev`` (before ``/dev/shm``, and before the kept directories, one
of which may lie in ``/run``) do what the helper's ``ns_private_run`` and ``ns_private_dev``
do: ``/run`` a small tmpfs holding ``lock/`` (``/var/run`` alike where it is a directory; the
file ``/etc/resolv.conf`` resolves to in ``/run`` bound at its place, through descriptor 7),
and ``/dev`` a small tmpfs of allowed devices, built in ``/run`` and moved onto ``/dev``.
``nsenter`` opens every pin before it enters any.
"""

from collections.abc import Callable, Sequence

from attrs import frozen

from sandboxd.isolation.namespaces.creators import Creator
from sandboxd.isolation.namespaces.kinds import KINDS, PIN
from sandboxd.isolation.none import find_program

SETUP = r"""
private_run() {
  [ -d /run ] && [ ! -L /run ] || return 0
  resolv=$(readlink -f /etc/resolv.conf 2>/dev/null)
  case "$resolv" in /run/*|/var/run/*) ;; *) resolv= ;; esac
  if [ -n "$resolv" ] && [ -f "$resolv" ]; then exec 7<"$resolv"; else resolv=; fi
  mount -t tmpfs -o nosuid,nodev,noexec,size=1m,nr_inodes=256,mode=0755 tmpfs /run || return 1
  mkdir -m 1777 /run/lock || return 1
  if [ -d /var/run ] && [ ! -L /var/run ]; then mount --bind /run /var/run || return 1; fi
  if [ -n "$resolv" ]; then
    (umask 022 && mkdir -p -- "${resolv%/*}" && : > "$resolv") || return 1
    mount -c --bind /proc/self/fd/7 "$resolv" || return 1
  fi
}
private_dev() {
  [ -d /dev ] && [ ! -L /dev ] && [ -d /run ] && [ ! -L /run ] || return 0
  s=/run/.sandboxd-dev
  mkdir "$s" || return 1
  mount -t tmpfs -o nosuid,nodev,noexec,size=64k,nr_inodes=64,mode=0755 tmpfs "$s" || return 1
  for n in null zero full random urandom tty ptmx; do
    if [ -c "/dev/$n" ] && [ ! -L "/dev/$n" ]; then
      : > "$s/$n" && mount --bind "/dev/$n" "$s/$n" || return 1
    fi
  done
  if [ -d /dev/pts ] && [ ! -L /dev/pts ]; then
    mkdir "$s/pts" && mount --rbind /dev/pts "$s/pts" || return 1
  fi
  if [ -e /dev/shm ]; then mkdir "$s/shm" || return 1; fi
  if [ -d /dev/mqueue ] && [ ! -L /dev/mqueue ]; then
    mkdir "$s/mqueue" || return 1
    if [ "$ipc" != 1 ]; then mount --bind /dev/mqueue "$s/mqueue" || return 1; fi
  fi
  ln -s /proc/self/fd "$s/fd" && ln -s /proc/self/fd/0 "$s/stdin" || return 1
  ln -s /proc/self/fd/1 "$s/stdout" && ln -s /proc/self/fd/2 "$s/stderr" || return 1
  mount --move "$s" /dev && rmdir "$s"
}
nsroot=$1 tmp=$2 home=$3 shm=$4 ipc=$5 net=$6 mnt=$7 ids=$8
shift 8
if [ "$mnt" = 1 ]; then
  umount -l -- "$nsroot" 2>/dev/null
  exec 9<"$tmp" 8<"$home" || exit 125
  i=3
  for k do eval "exec $i<\"\$k\"" || exit 125; i=$((i + 1)); done
  for p in /tmp /var/tmp; do
    if [ -d "$p" ]; then mount -c --bind /proc/self/fd/9 "$p" || exit 125; fi
  done
  private_run && private_dev || exit 125
  if [ -d /dev/shm ]; then
    mount -t tmpfs -o "nosuid,nodev,size=$shm,mode=1777" tmpfs /dev/shm || exit 125
  fi
  if [ "$ipc" = 1 ] && [ -d /dev/mqueue ]; then
    mount -t mqueue -o nosuid,nodev,noexec mqueue /dev/mqueue || exit 125
  fi
  if [ -d /home ] && [ ! -L /home ]; then
    mount -t tmpfs -o nosuid,nodev,size=1m,nr_inodes=64,mode=0755 tmpfs /home || exit 125
    mkdir -m 0755 /home/user && mount -c --bind /proc/self/fd/8 /home/user || exit 125
  fi
  i=3
  for k do
    mkdir -p -- "$k" && mount -c --rbind "/proc/self/fd/$i" "$k" || exit 125
    i=$((i + 1))
  done
  for f in passwd group; do
    if [ -f "$ids/$f" ] && [ -f "/etc/$f" ]; then
      mount -c --bind "$ids/$f" "/etc/$f" || exit 125
    fi
  done
fi
if [ "$net" = 1 ]; then ip link set lo up || exit 125; fi
"""

_PINS = 'd=$1; shift; for n in $PINS; do : > "$d/$n" || exit 125; done; exec "$@"'

_OPTIONS = {"ipc": "--ipc", "mount": "--mount", "net": "--net"}


@frozen
class ShellPrograms:
    """Absolute paths of what the shell steps run, resolved once at start-up."""

    sh: str
    unshare: str
    nsenter: str
    mount: str
    ip: str

    @classmethod
    def find(cls, which: Callable[[str], str] = find_program) -> "ShellPrograms":
        return cls(
            sh=which("sh"),
            unshare=which("unshare"),
            nsenter=which("nsenter"),
            mount=which("mount"),
            ip=which("ip"),
        )


@frozen
class ShellCreator(Creator):
    """``unshare(1)`` at create, ``nsenter`` before each exec."""

    programs: ShellPrograms

    def argv(
        self,
        nsroot: str,
        rid: str,
        kinds: frozenset[str],
        places: tuple[str, str],
        shm: int,
        keep: list[str],
    ) -> list[str]:
        directory = f"{nsroot}/{rid}"
        names = " ".join(PIN[kind] for kind in KINDS if kind in kinds)
        options = [f"{_OPTIONS[kind]}={directory}/{PIN[kind]}" for kind in KINDS if kind in kinds]
        flags = ["1" if kind in kinds else "0" for kind in ("ipc", "net", "mount")]
        return [
            self.programs.sh,
            "-c",
            _PINS.replace("$PINS", names),
            "sh",
            directory,
            self.programs.unshare,
            *options,
            "--propagation=slave",
            "--",
            self.programs.sh,
            "-c",
            SETUP,
            "sh",
            nsroot,
            *places,
            str(shm),
            *flags,
            directory,
            *keep,
        ]

    def enter(self, pins: Sequence[str], argv: list[str]) -> list[str]:
        by_file = {PIN[kind]: option for kind, option in _OPTIONS.items()}
        options = [f"{by_file[pin.rsplit('/', 1)[-1]]}={pin}" for pin in pins]
        return [self.programs.nsenter, *options, "--", *argv]
