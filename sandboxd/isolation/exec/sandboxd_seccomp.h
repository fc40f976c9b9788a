/*
 * The default seccomp filter of sandboxd-exec (included by sandboxd_exec.c only).
 *
 * In the spirit of Docker's default profile, for commands that already run as a bare uid with no
 * capability and no_new_privs: the filter takes away the kernel interfaces that such a uid can
 * still reach and that kernel privilege escalations start from, and, as a second line, those
 * that only a capability would open (should a capability ever be had, e.g. inside a user
 * namespace). Everything else is allowed: a deny list, not Docker's allow list, because the uid
 * already holds no capability (the allow list's job in a root container) and an allow list
 * breaks every program that uses a system call newer than the list.
 *
 *   - every foreign ABI is killed: a system call with another audit architecture than the
 *     helper's own (i386 through int 0x80 or a 32-bit program) or an x32 number; their numbers
 *     differ, so a number list cannot refuse them one by one (number -1, a call a tracer such
 *     as strace cancelled, passes: the kernel answers it ENOSYS itself, as libseccomp allows);
 *   - numbers above the last one this list knows of (LAST_KNOWN) and clone3 (whose flags sit
 *     in memory a filter cannot read) answer ENOSYS: the C library falls back (clone3 to clone),
 *     as with Docker's profile, and a future system call is unavailable until listed;
 *   - clone and unshare with any CLONE_NEW* flag answer EPERM (no new user namespace, hence
 *     none of the capabilities one gives: nf_tables, AF_PACKET, TUN, mounts...);
 *   - socket and socketpair of any family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK answer
 *     EAFNOSUPPORT (what a kernel without the family says, so programs fall back): AF_PACKET,
 *     AF_ALG, AF_VSOCK, AF_TIPC, AF_RDS... are protocol code few sandboxes need and many
 *     CVEs came from. AF_NETLINK stays: ip, ss and the C library's getaddrinfo (AI_ADDRCONFIG)
 *     need NETLINK_ROUTE, and its dangerous protocols (nf_tables, xfrm) want CAP_NET_ADMIN in
 *     the user namespace owning the network namespace, which a sandbox cannot make;
 *   - personality with any persona but Linux (optionally PER_LINUX32, UNAME26,
 *     ADDR_NO_RANDOMIZE, which debuggers set for their debuggee) or the query 0xffffffff
 *     answers EPERM (READ_IMPLIES_EXEC, MMAP_PAGE_ZERO... help exploits);
 *   - the DENIED list answers EPERM.
 * The numbers with a rule (DENIED and the argument checks) are found by a binary search.
 * ptrace stays allowed: the kernel's uid check (and yama, where loaded) decides, so strace and
 * gdb work on the sandbox's own processes and nothing else.
 */
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#if defined(__x86_64__)
#define FILTER_ARCH AUDIT_ARCH_X86_64
#define X32_SYSCALL_BIT 0x40000000U
/* The last x86_64 system call this list was written against (file_setattr, Linux 6.17). */
#define LAST_KNOWN 469U
#ifndef __NR_open_tree_attr
#define __NR_open_tree_attr 467
#endif
#else
#define FILTER_ARCH 0 /* no filter for this architecture: applying it fails (ENOSYS) */
#endif

#define NAMESPACE_FLAGS                                                                       \
    (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |             \
     CLONE_NEWPID | CLONE_NEWNET)
#define UNSHARE_NAMESPACE_FLAGS (NAMESPACE_FLAGS | 0x00000080U /* CLONE_NEWTIME */)
#define PERSONA_QUERY 0xffffffffU
#define SKIPPED 0xffffffffU /* number -1: a tracer cancelled the call (the kernel answers ENOSYS) */

#if FILTER_ARCH != 0
static const unsigned int DENIED[] = {
    /* io_uring, userfaultfd, eBPF, perf events: reachable by any uid, full of kernel bugs */
    __NR_io_uring_setup, __NR_io_uring_enter, __NR_io_uring_register, __NR_userfaultfd,
    __NR_bpf, __NR_perf_event_open, __NR_fanotify_init,
    /* keyrings */
    __NR_add_key, __NR_request_key, __NR_keyctl,
    /* namespaces and mounts */
    __NR_setns, __NR_mount, __NR_umount2, __NR_pivot_root, __NR_move_mount, __NR_fsopen,
    __NR_fsconfig, __NR_fsmount, __NR_fspick, __NR_open_tree, __NR_mount_setattr,
    __NR_open_tree_attr,
    /* the machine's: kernel images and modules, swap, reboot, accounting, clock, ports */
    __NR_kexec_load, __NR_kexec_file_load, __NR_init_module, __NR_finit_module,
    __NR_delete_module, __NR_create_module, __NR_get_kernel_syms, __NR_query_module,
    __NR_swapon, __NR_swapoff, __NR_reboot, __NR_acct, __NR_settimeofday, __NR_clock_settime,
    __NR_iopl, __NR_ioperm, __NR_syslog, __NR_quotactl, __NR_vhangup,
    /* file handles (the "shocker" escape), and obsolete interfaces */
    __NR_open_by_handle_at, __NR_lookup_dcookie, __NR_uselib, __NR_ustat, __NR_sysfs,
    __NR_nfsservctl, __NR__sysctl,
};

static const unsigned int ALLOWED_FAMILIES[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};

static const unsigned int ALLOWED_PERSONAS[] = {
    0x0000000, 0x0000008, 0x0020000, 0x0020008, /* PER_LINUX, PER_LINUX32, UNAME26 */
    0x0040000, 0x0040008, 0x0060000, 0x0060008, /* the same with ADDR_NO_RANDOMIZE */
    PERSONA_QUERY,
};
#endif

/* Jump targets: the shared returns at the end, and the argument checks. */
enum target { NEXT, ALLOW, DENY, NO_SYSCALL, NO_FAMILY, KILL, AT_CLONE, AT_UNSHARE,
              AT_SOCKET, AT_PERSONALITY, TARGETS };
/* Labels from TARGETS on are made as needed (the branches of the number search). */

#define MAX_INSNS 192
#define MAX_LABELS 128

struct program {
    struct sock_filter insns[MAX_INSNS];
    unsigned char jt[MAX_INSNS], jf[MAX_INSNS]; /* the label of each branch, NEXT if none */
    unsigned int at[MAX_LABELS];
    unsigned int labels;
    unsigned int length;
};

static void emit(struct program *p, unsigned short code, unsigned int k, unsigned int jt,
                 unsigned int jf)
{
    if (p->length >= MAX_INSNS)
        return; /* caught by finish() */
    p->insns[p->length] = (struct sock_filter)BPF_JUMP(code, k, 0, 0);
    p->jt[p->length] = (unsigned char)jt;
    p->jf[p->length] = (unsigned char)jf;
    p->length++;
}

static void label(struct program *p, unsigned int where) { p->at[where] = p->length; }

static unsigned int new_label(struct program *p)
{
    return p->labels < MAX_LABELS ? p->labels++ : MAX_LABELS - 1; /* overflow: finish() fails */
}

static void load(struct program *p, unsigned int offset)
{
    emit(p, BPF_LD | BPF_W | BPF_ABS, offset, NEXT, NEXT);
}

static void give(struct program *p, enum target where, unsigned int action)
{
    label(p, where);
    emit(p, BPF_RET | BPF_K, action, NEXT, NEXT);
}

/* Resolve every branch to its target: 0 when each is forward and in reach, else -1. */
static int finish(struct program *p)
{
    if (p->length >= MAX_INSNS || p->labels >= MAX_LABELS)
        return -1;
    for (unsigned int i = 0; i < p->length; i++) {
        unsigned char targets[2] = {p->jt[i], p->jf[i]};
        unsigned char *fields[2] = {&p->insns[i].jt, &p->insns[i].jf};
        for (int j = 0; j < 2; j++) {
            if (targets[j] == NEXT)
                continue;
            unsigned int to = p->at[targets[j]];
            if (to <= i || to - i - 1 > 255)
                return -1;
            *fields[j] = (unsigned char)(to - i - 1);
        }
    }
    return 0;
}

#define ARG0_LOW (offsetof(struct seccomp_data, args[0])) /* little-endian: the low word */
#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

struct rule {
    unsigned int nr;
    enum target target;
};

static int by_number(const void *a, const void *b)
{
    unsigned int x = ((const struct rule *)a)->nr, y = ((const struct rule *)b)->nr;
    return (x > y) - (x < y);
}

/* Branch on the number in A to the target of its rule (ALLOW for none), by binary search over
 * the rules sorted by number: a dozen instructions per call instead of one per rule, which
 * matters once per exec, when the kernel runs the filter for every number to find those it
 * always allows (its cache), and for each call that is not cached. */
static void search(struct program *p, const struct rule *rules, size_t count)
{
    if (count <= 3) {
        for (size_t i = 0; i < count; i++)
            emit(p, BPF_JMP | BPF_JEQ | BPF_K, rules[i].nr, rules[i].target,
                 i + 1 == count ? ALLOW : NEXT);
        return;
    }
    size_t half = count / 2;
    unsigned int upper = new_label(p);
    emit(p, BPF_JMP | BPF_JGE | BPF_K, rules[half].nr, upper, NEXT);
    search(p, rules, half);
    label(p, upper);
    search(p, rules + half, count - half);
}

/* The default filter; -1 (errno ENOSYS) where it does not exist for this architecture. */
static int build_filter(struct program *p)
{
#if FILTER_ARCH == 0
    (void)p;
    errno = ENOSYS;
    return -1;
#else
    static const struct rule SPECIAL[] = {
        {__NR_clone3, NO_SYSCALL},  {__NR_clone, AT_CLONE},   {__NR_unshare, AT_UNSHARE},
        {__NR_socket, AT_SOCKET},   {__NR_socketpair, AT_SOCKET},
        {__NR_personality, AT_PERSONALITY},
    };
    struct rule rules[COUNT(SPECIAL) + COUNT(DENIED)];
    size_t count = 0;
    for (size_t i = 0; i < COUNT(SPECIAL); i++)
        rules[count++] = SPECIAL[i];
    for (size_t i = 0; i < COUNT(DENIED); i++)
        rules[count++] = (struct rule){DENIED[i], DENY};
    qsort(rules, count, sizeof rules[0], by_number);
    for (size_t i = 1; i < count; i++) {
        if (rules[i].nr == rules[i - 1].nr) {
            errno = EINVAL; /* a number listed twice: a mistake in the lists above */
            return -1;
        }
    }
    p->length = 0;
    p->labels = TARGETS;
    load(p, offsetof(struct seccomp_data, arch));
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, FILTER_ARCH, NEXT, KILL);
    load(p, offsetof(struct seccomp_data, nr));
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, SKIPPED, ALLOW, NEXT);
    emit(p, BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, KILL, NEXT);
    emit(p, BPF_JMP | BPF_JGT | BPF_K, LAST_KNOWN, NO_SYSCALL, NEXT);
    search(p, rules, count);

    label(p, AT_CLONE);
    load(p, ARG0_LOW);
    emit(p, BPF_JMP | BPF_JSET | BPF_K, NAMESPACE_FLAGS, DENY, ALLOW);
    label(p, AT_UNSHARE);
    load(p, ARG0_LOW);
    emit(p, BPF_JMP | BPF_JSET | BPF_K, UNSHARE_NAMESPACE_FLAGS, DENY, ALLOW);
    label(p, AT_SOCKET);
    load(p, ARG0_LOW);
    for (size_t i = 0; i < COUNT(ALLOWED_FAMILIES); i++)
        emit(p, BPF_JMP | BPF_JEQ | BPF_K, ALLOWED_FAMILIES[i], ALLOW, NEXT);
    give(p, NO_FAMILY, SECCOMP_RET_ERRNO | EAFNOSUPPORT);
    label(p, AT_PERSONALITY);
    load(p, ARG0_LOW);
    for (size_t i = 0; i < COUNT(ALLOWED_PERSONAS); i++)
        emit(p, BPF_JMP | BPF_JEQ | BPF_K, ALLOWED_PERSONAS[i], ALLOW, NEXT);
    give(p, DENY, SECCOMP_RET_ERRNO | EPERM);
    give(p, NO_SYSCALL, SECCOMP_RET_ERRNO | ENOSYS);
    give(p, KILL, SECCOMP_RET_KILL_PROCESS);
    give(p, ALLOW, SECCOMP_RET_ALLOW);
    if (finish(p) != 0) {
        errno = E2BIG;
        return -1;
    }
    return 0;
#endif
}
