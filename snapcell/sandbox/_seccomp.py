"""The worker's seccomp filter: an allowlist of the syscalls a CPython worker needs, everything else EPERM.

A classic BPF program, built here and installed by `_sandbox.apply_sandbox` in the process it
confines. It is built for one process: calls that can name another process (``kill``, ``tgkill``,
``prlimit64``, ``sched_*``, ``setpriority``...) are allowed only on that process, whose pid is baked
into the program when it is built (so a zygote child that forks and then confines itself gets a
filter naming itself). A denied call fails with ``EPERM``, so a script gets a Python
``PermissionError`` rather than a dead worker; ``clone3`` fails with ``ENOSYS`` so that glibc falls
back to ``clone``, whose flags a filter can read. Another ABI (i386 via ``int 0x80``) kills the process:
its syscall numbers differ and nothing here may be misread.

The allowlist was read off ``strace -f`` of workers running the test suite, then trimmed to what a
sandboxed interpreter may legitimately do: files through the descriptors and paths Landlock allows,
memory, threads, time, signals to itself, the inherited socket pair. Sockets, exec, fork (unless
``max_processes`` allows it), namespaces, mounts, ptrace, BPF, perf, keyrings, io_uring, SysV IPC,
POSIX message queues, ``memfd_create``, fanotify/inotify, clock and host-name changes, uid/gid changes
and capabilities are all outside it.

Calls with options that reach past the process are allowed by argument (see `_guarded`): ``prctl``,
``ioctl``, ``fcntl`` and ``setsockopt`` only with the options on their lists (no clearing the parent-death
signal, no socket ioctls that list the host's interfaces, no signal-on-I/O owner, no socket filters),
``socketpair`` only for an AF_UNIX stream pair, ``sendto`` only without an address. ``sendmsg`` and
``sendmmsg`` are denied: their destination and ancillary data (descriptors) sit in user memory that a
filter cannot read, and no worker sends with them. So every socket a worker holds is a connected stream,
and nothing it sends can be aimed at a pathname socket such as ``/dev/log`` (which Landlock up to ABI 7
does not cover).
"""

from __future__ import annotations

import errno
import os
import struct
import sys

__all__ = [
    "allowed_syscalls",
    "build_filter",
    "denied_syscalls",
    "machine",
    "packed_filter",
    "prctl_options",
    "warm_filters",
]

_ALLOW = {
    "x86_64": {
        "read": 0, "write": 1, "futex": 202, "newfstatat": 262, "lseek": 8, "openat": 257, "close": 3,
        "mmap": 9, "munmap": 11, "mprotect": 10, "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14,
        "rt_sigreturn": 15, "getdents64": 217, "getpid": 39, "gettid": 186, "epoll_pwait": 281, "recvfrom": 45,
        "recvmsg": 47, "getrandom": 318, "pread64": 17, "pwrite64": 18,
        "readv": 19, "writev": 20, "madvise": 28, "mremap": 25, "statx": 332, "fstat": 5, "getcwd": 79,
        "readlinkat": 267, "faccessat": 269, "faccessat2": 439, "dup": 32, "dup3": 292, "close_range": 436,
        "pipe2": 293, "eventfd2": 290, "epoll_create1": 291, "epoll_ctl": 233, "epoll_pwait2": 441, "ppoll": 271,
        "pselect6": 270, "clock_gettime": 228, "clock_getres": 229, "clock_nanosleep": 230, "nanosleep": 35,
        "gettimeofday": 96, "set_robust_list": 273, "set_tid_address": 218, "rseq": 334, "sched_yield": 24,
        "sched_get_priority_max": 146, "sched_get_priority_min": 147, "getppid": 110, "getuid": 102, "geteuid": 107,
        "getgid": 104, "getegid": 108, "getresuid": 118, "getresgid": 120, "getgroups": 115, "uname": 63, "sysinfo": 99,
        "getrusage": 98, "times": 100, "getcpu": 309, "umask": 95, "exit": 60, "exit_group": 231,
        "wait4": 61, "waitid": 247, "getrlimit": 97, "setrlimit": 160, "sigaltstack": 131, "rt_sigsuspend": 130,
        "rt_sigpending": 127, "rt_sigtimedwait": 128, "restart_syscall": 219, "setitimer": 38, "getitimer": 36,
        "timer_create": 222, "timer_settime": 223, "timer_gettime": 224, "timer_getoverrun": 225, "timer_delete": 226,
        "timerfd_create": 283, "timerfd_settime": 286, "timerfd_gettime": 287, "signalfd4": 289, "preadv": 295,
        "pwritev": 296, "preadv2": 327, "pwritev2": 328, "flock": 73, "fsync": 74, "fdatasync": 75, "ftruncate": 77,
        "truncate": 76, "fallocate": 285, "fadvise64": 221, "sendfile": 40, "copy_file_range": 326, "splice": 275,
        "tee": 276, "openat2": 437, "statfs": 137, "fstatfs": 138, "chdir": 80, "fchdir": 81, "mkdirat": 258,
        "unlinkat": 263, "renameat": 264, "renameat2": 316, "linkat": 265, "symlinkat": 266, "fchmod": 91,
        "fchmodat": 268, "fchmodat2": 452, "fchownat": 260, "fchown": 93, "utimensat": 280, "mknodat": 259,
        "shutdown": 48, "getsockname": 51, "getpeername": 52, "getsockopt": 55,
        "recvmmsg": 299, "msync": 26, "mincore": 27, "membarrier": 324, "getxattr": 191, "lgetxattr": 192,
        "fgetxattr": 193, "listxattr": 194, "llistxattr": 195, "flistxattr": 196, "setxattr": 188, "lsetxattr": 189,
        "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199, "futex_waitv": 449, "stat": 4,
        "lstat": 6, "open": 2, "access": 21, "readlink": 89, "getdents": 78, "dup2": 33, "pipe": 22, "eventfd": 284,
        "epoll_create": 213, "epoll_wait": 232, "poll": 7, "select": 23, "mkdir": 83, "rmdir": 84, "unlink": 87,
        "rename": 82, "link": 86, "symlink": 88, "chmod": 90, "chown": 92, "lchown": 94, "utime": 132, "utimes": 235,
        "futimesat": 261, "mknod": 133, "creat": 85, "pause": 34, "alarm": 37, "time": 201, "getpgrp": 111,
        "arch_prctl": 158, "signalfd": 282,
    },
    "aarch64": {
        "read": 63, "write": 64, "futex": 98, "newfstatat": 79, "lseek": 62, "openat": 56, "close": 57,
        "mmap": 222, "munmap": 215, "mprotect": 226, "brk": 214, "rt_sigaction": 134, "rt_sigprocmask": 135,
        "rt_sigreturn": 139, "getdents64": 61, "getpid": 172, "gettid": 178, "epoll_pwait": 22, "recvfrom": 207,
        "recvmsg": 212, "getrandom": 278, "pread64": 67, "pwrite64": 68,
        "readv": 65, "writev": 66, "madvise": 233, "mremap": 216, "statx": 291, "fstat": 80, "getcwd": 17,
        "readlinkat": 78, "faccessat": 48, "faccessat2": 439, "dup": 23, "dup3": 24, "close_range": 436, "pipe2": 59,
        "eventfd2": 19, "epoll_create1": 20, "epoll_ctl": 21, "epoll_pwait2": 441, "ppoll": 73, "pselect6": 72,
        "clock_gettime": 113, "clock_getres": 114, "clock_nanosleep": 115, "nanosleep": 101, "gettimeofday": 169,
        "set_robust_list": 99, "set_tid_address": 96, "rseq": 293, "sched_yield": 124, "sched_get_priority_max": 125,
        "sched_get_priority_min": 126, "getppid": 173, "getuid": 174, "geteuid": 175, "getgid": 176, "getegid": 177,
        "getresuid": 148, "getresgid": 150, "getgroups": 158, "uname": 160, "sysinfo": 179, "getrusage": 165,
        "times": 153, "getcpu": 168, "umask": 166, "exit": 93, "exit_group": 94, "wait4": 260,
        "waitid": 95, "getrlimit": 163, "setrlimit": 164, "sigaltstack": 132, "rt_sigsuspend": 133,
        "rt_sigpending": 136, "rt_sigtimedwait": 137, "restart_syscall": 128, "setitimer": 103, "getitimer": 102,
        "timer_create": 107, "timer_settime": 110, "timer_gettime": 108, "timer_getoverrun": 109, "timer_delete": 111,
        "timerfd_create": 85, "timerfd_settime": 86, "timerfd_gettime": 87, "signalfd4": 74, "preadv": 69,
        "pwritev": 70, "preadv2": 286, "pwritev2": 287, "flock": 32, "fsync": 82, "fdatasync": 83, "ftruncate": 46,
        "truncate": 45, "fallocate": 47, "fadvise64": 223, "sendfile": 71, "copy_file_range": 285, "splice": 76,
        "tee": 77, "openat2": 437, "statfs": 43, "fstatfs": 44, "chdir": 49, "fchdir": 50, "mkdirat": 34,
        "unlinkat": 35, "renameat": 38, "renameat2": 276, "linkat": 37, "symlinkat": 36, "fchmod": 52, "fchmodat": 53,
        "fchmodat2": 452, "fchownat": 54, "fchown": 55, "utimensat": 88, "mknodat": 33, "shutdown": 210,
        "getsockname": 204, "getpeername": 205, "getsockopt": 209, "recvmmsg": 243,
        "msync": 227, "mincore": 232, "membarrier": 283, "getxattr": 8, "lgetxattr": 9, "fgetxattr": 10,
        "listxattr": 11, "llistxattr": 12, "flistxattr": 13, "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7,
        "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16, "futex_waitv": 449,
    },
}  # fmt: skip

_ONLY_SELF = {
    "x86_64": {
        "kill": 62, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    },
    "aarch64": {
        "kill": 129, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
    },
}  # fmt: skip

_SELF_OR_ZERO = {
    "x86_64": {
        "prlimit64": 302, "sched_getaffinity": 204, "sched_setaffinity": 203, "sched_getparam": 143,
        "sched_setparam": 142, "sched_getscheduler": 145, "sched_setscheduler": 144, "sched_getattr": 315,
        "sched_setattr": 314, "sched_rr_get_interval": 148, "getpgid": 121, "getsid": 124,
    },
    "aarch64": {
        "prlimit64": 261, "sched_getaffinity": 123, "sched_setaffinity": 122, "sched_getparam": 121,
        "sched_setparam": 118, "sched_getscheduler": 120, "sched_setscheduler": 119, "sched_getattr": 275,
        "sched_setattr": 274, "sched_rr_get_interval": 127, "getpgid": 155, "getsid": 156,
    },
}  # fmt: skip

_WHO_ZERO = {
    "x86_64": {
        "setpriority": 141, "getpriority": 140,
    },
    "aarch64": {
        "setpriority": 140, "getpriority": 141,
    },
}  # fmt: skip

_NOTABLE_DENIED = {
    "x86_64": {
        "socket": 41, "connect": 42, "accept": 43, "accept4": 288, "bind": 49, "listen": 50, "execve": 59,
        "execveat": 322, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246,
        "kexec_file_load": 320, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "setns": 308,
        "unshare": 272, "bpf": 321, "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249,
        "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168,
        "iopl": 172, "ioperm": 173, "open_by_handle_at": 304, "name_to_handle_at": 303, "pidfd_open": 434,
        "pidfd_getfd": 438, "pidfd_send_signal": 424, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67,
        "semget": 64, "semop": 65, "semctl": 66, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240,
        "mq_unlink": 241, "fanotify_init": 300, "fanotify_mark": 301, "clock_settime": 227, "clock_adjtime": 305,
        "settimeofday": 164, "adjtimex": 159, "sethostname": 170, "setdomainname": 171, "memfd_create": 319,
        "tkill": 200, "setuid": 105, "setgid": 106, "setreuid": 113, "setregid": 114, "setresuid": 117,
        "setresgid": 119, "setgroups": 116, "capset": 126, "setpgid": 109, "setsid": 112, "personality": 135,
        "syslog": 103, "acct": 163, "quotactl": 179, "process_madvise": 440, "process_mrelease": 448, "move_pages": 279,
        "migrate_pages": 256, "get_robust_list": 274, "kcmp": 312, "ioprio_set": 251, "inotify_init1": 294,
        "mlock": 149, "mlockall": 151, "modify_ldt": 154,
        "sendmsg": 46, "sendmmsg": 307,
    },
    "aarch64": {
        "socket": 198, "connect": 203, "accept": 202, "accept4": 242, "bind": 200, "listen": 201, "execve": 221,
        "execveat": 281, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kexec_load": 104,
        "kexec_file_load": 294, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "setns": 268, "unshare": 97,
        "bpf": 280, "perf_event_open": 241, "keyctl": 219, "add_key": 217, "request_key": 218, "userfaultfd": 282,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "reboot": 142, "swapon": 224, "swapoff": 225,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "pidfd_open": 434, "pidfd_getfd": 438,
        "pidfd_send_signal": 424, "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193,
        "semctl": 191, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "mq_open": 180, "mq_unlink": 181,
        "fanotify_init": 262, "fanotify_mark": 263, "clock_settime": 112, "clock_adjtime": 266, "settimeofday": 170,
        "adjtimex": 171, "sethostname": 161, "setdomainname": 162, "memfd_create": 279, "tkill": 130, "setuid": 146,
        "setgid": 144, "setreuid": 145, "setregid": 143, "setresuid": 147, "setresgid": 149, "setgroups": 159,
        "capset": 91, "setpgid": 154, "setsid": 157, "personality": 92, "syslog": 116, "acct": 89, "quotactl": 60,
        "process_madvise": 440, "process_mrelease": 448, "move_pages": 239, "migrate_pages": 238,
        "get_robust_list": 100, "kcmp": 272, "ioprio_set": 30, "inotify_init1": 26, "mlock": 228, "mlockall": 230,
        "sendmsg": 211, "sendmmsg": 269,
    },
}  # fmt: skip

# Calls allowed only with some arguments (their numbers; the rules are in `_guarded`).
_GUARDED = {
    "x86_64": {
        "sendto": 44, "ioctl": 16, "fcntl": 72, "prctl": 157, "setsockopt": 54, "socketpair": 53,
    },
    "aarch64": {
        "sendto": 206, "ioctl": 29, "fcntl": 25, "prctl": 167, "setsockopt": 208, "socketpair": 199,
    },
}  # fmt: skip

# prctl options a worker may use once confined: reads of its own state, and naming its threads and memory maps
# (glibc and libraries name threads with PR_SET_NAME; PR_SET_VMA names anonymous mappings). Every option that
# changes what the process may do or who may reach it is refused: PR_SET_PDEATHSIG (outliving the host),
# PR_SET_DUMPABLE, PR_SET_PTRACER, PR_SET_CHILD_SUBREAPER, PR_SET_MM, PR_SET_SECCOMP, PR_SET_SECUREBITS,
# PR_SET_KEEPCAPS, PR_CAP_AMBIENT, PR_SET_NO_NEW_PRIVS, PR_SCHED_CORE (which names other processes), ...
_PRCTL_OPTIONS = {
    "PR_GET_PDEATHSIG": 2, "PR_GET_DUMPABLE": 3, "PR_GET_KEEPCAPS": 7, "PR_SET_NAME": 15, "PR_GET_NAME": 16,
    "PR_GET_SECCOMP": 21, "PR_CAPBSET_READ": 23, "PR_GET_SECUREBITS": 27, "PR_GET_TIMERSLACK": 30,
    "PR_GET_CHILD_SUBREAPER": 37, "PR_GET_NO_NEW_PRIVS": 39, "PR_GET_THP_DISABLE": 42,
    "PR_GET_SPECULATION_CTRL": 52, "PR_SET_VMA": 0x53564D41,
}  # fmt: skip
# Reads of the vector lengths and pointer-authentication keys, which aarch64 code may ask for at any time.
_PRCTL_ARCH_OPTIONS = {
    "x86_64": {},
    "aarch64": {"PR_SVE_GET_VL": 51, "PR_GET_TAGGED_ADDR_CTRL": 56, "PR_PAC_GET_ENABLED_KEYS": 61, "PR_SME_GET_VL": 64},
}
# ioctl requests (the same numbers on x86_64 and aarch64): what isatty, termios, os.get_terminal_size,
# socket.setblocking and os.set_inheritable use. Not socket ioctls (SIOCGIFCONF, SIOCGIFHWADDR: the host's network
# interfaces and addresses), FIOSETOWN/SIOCSPGRP (signals to another process), FIOASYNC or TIOCSTI.
_IOCTL_REQUESTS = {
    "TCGETS": 0x5401, "TCGETS2": 0x802C542A, "TIOCGWINSZ": 0x5413, "FIONREAD": 0x541B, "FIONBIO": 0x5421,
    "FIONCLEX": 0x5450, "FIOCLEX": 0x5451,
}  # fmt: skip
# fcntl commands: descriptors, status flags, locks (sqlite3) and reads. Not F_SETOWN, F_SETOWN_EX or F_SETSIG,
# which make the kernel signal a process of the caller's choosing on I/O, nor F_SETLEASE or F_NOTIFY (signals
# too), F_SETPIPE_SZ or F_ADD_SEALS.
_FCNTL_COMMANDS = {
    "F_DUPFD": 0, "F_GETFD": 1, "F_SETFD": 2, "F_GETFL": 3, "F_SETFL": 4, "F_GETLK": 5, "F_SETLK": 6, "F_SETLKW": 7,
    "F_GETOWN": 9, "F_GETSIG": 11, "F_GETOWN_EX": 16, "F_OFD_GETLK": 36, "F_OFD_SETLK": 37, "F_OFD_SETLKW": 38,
    "F_GETLEASE": 1025, "F_DUPFD_CLOEXEC": 1030, "F_GETPIPE_SZ": 1032, "F_GET_SEALS": 1034,
}  # fmt: skip
# setsockopt at SOL_SOCKET only, and only buffer sizes, watermarks, timeouts and credential passing: the worker's
# sockets are AF_UNIX stream pairs. Not SO_ATTACH_FILTER and its kin (a BPF program handed to the kernel).
_SOL_SOCKET = 1
_SOCKET_OPTIONS = {
    "SO_SNDBUF": 7, "SO_RCVBUF": 8, "SO_PASSCRED": 16, "SO_RCVLOWAT": 18, "SO_SNDLOWAT": 19, "SO_RCVTIMEO_OLD": 20,
    "SO_SNDTIMEO_OLD": 21, "SO_PEEK_OFF": 42, "SO_RCVTIMEO_NEW": 66, "SO_SNDTIMEO_NEW": 67,
}  # fmt: skip

_CLONE = {"x86_64": 56, "aarch64": 220}
_FORK = {"x86_64": {"fork": 57, "vfork": 58}, "aarch64": {}}
_CLONE3 = 435
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000

_CLONE_THREAD = 0x00010000
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET, and
# CLONE_PARENT, which would hand the new process to the worker's parent (the zygote or the host).
_CLONE_FORBIDDEN = 0x7E020000 | 0x00008000
_AF_UNIX = 1
_SOCK_STREAM = 1
_SOCK_TYPE_FLAGS = 0o2000000 | 0o4000  # SOCK_CLOEXEC | SOCK_NONBLOCK, or'ed into socketpair's type

_BPF_LD_W_ABS = 0x20
_BPF_ALU_AND_K = 0x54
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_JSET_K = 0x45
_BPF_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_BPF_MAX_JUMP = 255  # jt and jf are one byte each
# Offsets in struct seccomp_data. Every argument checked here is an int, unsigned int or pid_t, of which the kernel
# uses the low 32 bits only, and those come first on little-endian machines; a pointer is checked in both halves.
_OFF_NR = 0
_OFF_ARCH = 4


def _arg_low(index: int) -> int:
    return 16 + 8 * index


def _arg_high(index: int) -> int:
    return 16 + 8 * index + 4


Insn = tuple[int, int, int, int]
_EPERM: Insn = (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)
_ALLOW_RET: Insn = (_BPF_RET_K, 0, 0, _RET_ALLOW)


def machine() -> str | None:
    """Return the architecture name the filter supports here (``"x86_64"``, ``"aarch64"``), or None."""
    name = os.uname().machine
    name = "aarch64" if name == "arm64" else name
    if name not in _AUDIT_ARCH or sys.maxsize < 2**32 or sys.byteorder != "little":
        return None
    return name


def denied_syscalls(*, deny_fork: bool = True) -> dict[str, str]:
    """Return what the filter does to the calls it does not simply allow, on this machine.

    Args:
        deny_fork: Whether fork-like calls are denied (``Limits.max_processes == 0``).

    Returns:
        Syscall name to its fate (``"EPERM"``, ``"ENOSYS"`` or a condition), including ``"*"`` for every
        call not listed; empty on an unsupported architecture.
    """
    arch = machine()
    if arch is None:
        return {}
    fates = dict.fromkeys(_NOTABLE_DENIED[arch], "EPERM")
    for name in _ONLY_SELF[arch]:
        fates[name] = "EPERM unless aimed at the worker itself"
    for name in _SELF_OR_ZERO[arch]:
        fates[name] = "EPERM unless pid is 0 or the worker's own"
    for name in _WHO_ZERO[arch]:
        fates[name] = "EPERM unless who is 0"
    if deny_fork:
        fates.update(dict.fromkeys(_FORK[arch], "EPERM"))
        fates["clone"] = "EPERM unless CLONE_THREAD, and always with namespace flags or CLONE_PARENT"
    else:
        fates["clone"] = "EPERM with namespace flags or CLONE_PARENT"
    fates["clone3"] = "ENOSYS"
    fates["prctl"] = "EPERM unless the option is " + _either(prctl_options(arch))
    fates["ioctl"] = "EPERM unless the request is " + _either(_IOCTL_REQUESTS)
    fates["fcntl"] = "EPERM unless the command is " + _either(_FCNTL_COMMANDS)
    fates["setsockopt"] = "EPERM unless the level is SOL_SOCKET and the option " + _either(_SOCKET_OPTIONS)
    fates["socketpair"] = "EPERM unless AF_UNIX and SOCK_STREAM (with or without SOCK_CLOEXEC, SOCK_NONBLOCK)"
    fates["sendto"] = "EPERM unless the destination address is NULL (a connected socket's peer)"
    fates["*"] = "EPERM (not on the allowlist)"
    return fates


def _either(names: dict[str, int]) -> str:
    *rest, last = names
    return f"{', '.join(rest)} or {last}" if rest else last


def prctl_options(arch: str) -> dict[str, int]:
    """Return the prctl options the filter allows on ``arch``, by name."""
    return {**_PRCTL_OPTIONS, **_PRCTL_ARCH_OPTIONS[arch]}


def allowed_syscalls(arch: str, *, deny_fork: bool) -> dict[str, int]:
    """Return the calls allowed without conditions on ``arch``."""
    allowed = dict(_ALLOW[arch])
    if not deny_fork:
        allowed.update(_FORK[arch])
    return allowed


def build_filter(arch: str, *, pid: int, deny_fork: bool) -> list[Insn]:
    """Build the BPF program for process ``pid`` on ``arch``.

    Args:
        arch: ``"x86_64"`` or ``"aarch64"``.
        pid: The process the filter confines; signals, rlimits and scheduling may name only it (or 0).
        deny_fork: Whether new processes are refused (threads are always allowed).

    Returns:
        The instructions as ``(code, jt, jf, k)`` tuples.
    """
    prog: list[Insn] = [
        (_BPF_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_BPF_JEQ_K, 1, 0, _AUDIT_ARCH[arch]),
        (_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),  # another ABI (i386, x32 via int 0x80) has other numbers
        (_BPF_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if arch == "x86_64":
        prog += [(_BPF_JGE_K, 0, 1, _X32_SYSCALL_BIT), _EPERM]
    guarded = _guarded(arch)
    # The channel's sends and the descriptor calls come often: their blocks go ahead of the plain allows, and cost
    # any other call one jump each.
    for name in ("sendto", "ioctl", "fcntl"):
        prog += guarded.pop(name)
    # Plain allows next, most frequent first: a pair each, so no jump is ever long.
    for nr in allowed_syscalls(arch, deny_fork=deny_fork).values():
        prog += [(_BPF_JEQ_K, 0, 1, nr), _ALLOW_RET]
    for nr in _ONLY_SELF[arch].values():
        prog += _arg_in(nr, 0, (pid,))
    for nr in _SELF_OR_ZERO[arch].values():
        prog += _arg_in(nr, 0, (0, pid))
    for nr in _WHO_ZERO[arch].values():
        prog += _arg_in(nr, 1, (0,))
    for block in guarded.values():
        prog += block
    prog += [(_BPF_JEQ_K, 0, 1, _CLONE3), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    if deny_fork:
        prog += [
            (_BPF_JEQ_K, 0, 5, _CLONE[arch]),
            (_BPF_LD_W_ABS, 0, 0, _arg_low(0)),
            (_BPF_JSET_K, 2, 0, _CLONE_FORBIDDEN),
            (_BPF_JSET_K, 0, 1, _CLONE_THREAD),
            _ALLOW_RET,
            _EPERM,
        ]
    else:
        prog += [
            (_BPF_JEQ_K, 0, 4, _CLONE[arch]),
            (_BPF_LD_W_ABS, 0, 0, _arg_low(0)),
            (_BPF_JSET_K, 0, 1, _CLONE_FORBIDDEN),
            _EPERM,
            _ALLOW_RET,
        ]
    prog.append(_EPERM)
    return prog


def _guarded(arch: str) -> dict[str, list[Insn]]:
    """The blocks of the calls allowed only with some arguments, by name."""
    nr = _GUARDED[arch]
    return {
        # Only to a connected socket's peer: with no address, no datagram can be aimed at a path such as /dev/log.
        "sendto": _when(nr["sendto"], (_arg_low(4), (0,)), (_arg_high(4), (0,))),
        "ioctl": _when(nr["ioctl"], (_arg_low(1), tuple(_IOCTL_REQUESTS.values()))),
        "fcntl": _when(nr["fcntl"], (_arg_low(1), tuple(_FCNTL_COMMANDS.values()))),
        "prctl": _when(nr["prctl"], (_arg_low(0), tuple(prctl_options(arch).values()))),
        "setsockopt": _when(
            nr["setsockopt"], (_arg_low(1), (_SOL_SOCKET,)), (_arg_low(2), tuple(_SOCKET_OPTIONS.values()))
        ),
        # asyncio's self-pipe and multiprocessing's duplex Pipe: a connected stream pair, which reaches nothing
        # outside and refuses a destination address (EISCONN), unlike a datagram pair.
        "socketpair": _when(
            nr["socketpair"], (_arg_low(0), (_AF_UNIX,)), (_arg_low(1), (_SOCK_STREAM,), ~_SOCK_TYPE_FLAGS & 0xFFFFFFFF)
        ),
    }


# One ``struct sock_filter``: code, jt, jf, k in the machine's byte order.
_INSN = struct.Struct("=HBBI")
# Programs packed ahead (by `warm_filters`, in a zygote before it forks) by architecture and ``deny_fork``, with the
# indices of the instructions that hold the pid: a child patches its pid in rather than building the program again
# (~100 page faults and a few hundred tuples per child).
_PACKED: dict[tuple[str, bool], tuple[bytes, tuple[int, ...]]] = {}
# Two pids no process has (pids stay below 2**22): where two programs built for them differ is where the pid goes.
_PID_PROBES = (0x3FFF_FFF1, 0x3FFF_FFF2)


def _pack(prog: list[Insn]) -> bytes:
    return b"".join(_INSN.pack(*insn) for insn in prog)


def warm_filters() -> None:
    """Pack the programs for this machine now (with and without fork), so `packed_filter` only patches in a pid."""
    arch = machine()
    if arch is None:
        return
    for deny_fork in (True, False):
        first, second = (build_filter(arch, pid=probe, deny_fork=deny_fork) for probe in _PID_PROBES)
        at = tuple(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
        # Only the pid's own instructions may differ, and only in their constant.
        if all(first[i][:3] == second[i][:3] and (first[i][3], second[i][3]) == _PID_PROBES for i in at):
            _PACKED[arch, deny_fork] = (_pack(first), at)


def packed_filter(arch: str, *, pid: int, deny_fork: bool) -> bytes:
    """`build_filter`'s program for ``pid``, packed as the kernel reads it (from the `warm_filters` template if any)."""
    template = _PACKED.get((arch, deny_fork))
    if template is None:
        return _pack(build_filter(arch, pid=pid, deny_fork=deny_fork))
    packed, at = template
    data = bytearray(packed)
    for index in at:
        struct.pack_into("=I", data, index * _INSN.size + 4, pid & 0xFFFFFFFF)
    return bytes(data)


def _arg_in(nr: int, index: int, values: tuple[int, ...]) -> list[Insn]:
    """A block: if the call is ``nr``, allow it when argument ``index`` is one of ``values``, else EPERM."""
    return _when(nr, (_arg_low(index), values))


def _when(nr: int, *checks: tuple[int, tuple[int, ...]] | tuple[int, tuple[int, ...], int]) -> list[Insn]:
    """A block: if the call is ``nr``, allow it when every check holds, else EPERM.

    Each check is ``(offset, values)`` or ``(offset, values, mask)``: the 32-bit word at ``offset`` in struct
    seccomp_data, and'ed with ``mask`` when given, must be one of ``values``. The block ends in a return whenever
    it loaded an argument, so the syscall number never needs reloading.

    Raises:
        ValueError: A jump would not fit in a BPF instruction (too many values): a bug here, not the caller's.
    """
    deny_at = sum(1 + (len(check) == 3) + len(check[1]) for check in checks) + 1  # checks, the allow, then EPERM
    body: list[Insn] = []
    for check in checks:
        offset, values = check[0], check[1]
        body.append((_BPF_LD_W_ABS, 0, 0, offset))
        if len(check) == 3:
            body.append((_BPF_ALU_AND_K, 0, 0, check[2]))
        passed_at = len(body) + len(values)  # the next check, or the allow after the last one
        for i, value in enumerate(values):
            here = len(body)
            last = i == len(values) - 1
            body.append((_BPF_JEQ_K, passed_at - here - 1, deny_at - here - 1 if last else 0, value & 0xFFFFFFFF))
    body += [_ALLOW_RET, _EPERM]
    block = [(_BPF_JEQ_K, 0, len(body), nr), *body]
    if any(max(jt, jf) > _BPF_MAX_JUMP for _code, jt, jf, _k in block):
        raise ValueError(f"a check of syscall {nr} has a jump longer than {_BPF_MAX_JUMP} instructions")
    return block
