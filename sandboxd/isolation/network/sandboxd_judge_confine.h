/*
 * The judge reads bytes a sandbox chose, as root would: so once its queue is bound it keeps
 * of root's power only what its verdicts need, CAP_NET_ADMIN (the kernel checks it at each
 * netlink message), as uid and gid nobody, with no_new_privs, and a seccomp filter that lets
 * through only the system calls of its loop (read and write its pipes, receive and send on
 * its netlink socket, poll, the clock, memory, exit). A flaw in its parsing then gains a
 * sandbox no new socket, file, process or namespace: at most verdicts on its own queue.
 * Included by sandboxd_judge.c only.
 */
#include <errno.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { NOBODY = 65534 };

#if defined(__x86_64__)
#define JUDGE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define JUDGE_ARCH AUDIT_ARCH_AARCH64
#endif

static const unsigned allowed_calls[] = {
    __NR_read,       __NR_write,      __NR_recvfrom,  __NR_recvmsg,       __NR_sendto,
    __NR_sendmsg,    __NR_ppoll,      __NR_brk,       __NR_mmap,          __NR_munmap,
    __NR_mremap,     __NR_madvise,    __NR_mprotect,  __NR_clock_gettime, __NR_exit,
    __NR_exit_group, __NR_rt_sigreturn,
#ifdef __NR_poll
    __NR_poll,
#endif
};

/* The allow-list above, anything else killing the process (its parent starts another). */
static int confine_calls(void) {
#ifndef JUDGE_ARCH
    fprintf(stderr, "sandboxd-judge: no seccomp filter for this architecture\n");
    return -1;
#else
    enum { CALLS = sizeof allowed_calls / sizeof allowed_calls[0] };
    struct sock_filter insns[4 + 2 * CALLS + 1];
    size_t n = 0;
    insns[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                              offsetof(struct seccomp_data, arch));
    insns[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, JUDGE_ARCH, 1, 0);
    insns[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    insns[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                              offsetof(struct seccomp_data, nr));
    for (size_t i = 0; i < CALLS; i++) {
        insns[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, allowed_calls[i],
                                                  0, 1);
        insns[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
    insns[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    struct sock_fprog program = {.len = (unsigned short)n, .filter = insns};
    return (int)syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program);
#endif
}

/* Nobody, CAP_NET_ADMIN alone, no_new_privs, then (with_filter) the filter; -1 on a failure
 * (the judge then exits: it never judges with more than it needs). */
static int confine(int with_filter) {
    if (prctl(PR_SET_KEEPCAPS, 1) != 0 || setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 ||
        setuid(NOBODY) != 0) {
        perror("sandboxd-judge: drop to nobody");
        return -1;
    }
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct caps[2] = {{0}};
    caps[CAP_TO_INDEX(CAP_NET_ADMIN)].effective = CAP_TO_MASK(CAP_NET_ADMIN);
    caps[CAP_TO_INDEX(CAP_NET_ADMIN)].permitted = CAP_TO_MASK(CAP_NET_ADMIN);
    if (syscall(__NR_capset, &header, caps) != 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) {
        perror("sandboxd-judge: capabilities");
        return -1;
    }
    if (with_filter && confine_calls() != 0) {
        perror("sandboxd-judge: seccomp");
        return -1;
    }
    return 0;
}

/* "confine-check [none]": confine (without the filter with "none"), then try what the filter
 * refuses: a new socket. Killed by SIGSYS when the filter holds; exit 3 when the socket was
 * made. */
static int confine_check(int with_filter) {
    if (confine(with_filter) != 0)
        return 1;
    long made = syscall(__NR_socket, AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
    return made >= 0 ? 3 : 4;
}
