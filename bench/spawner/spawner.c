/*
 * spawner: a prototype for docs/spawner-design.rst, NOT wired into the daemon.
 *
 * Measures where the time of one isolated "exec true" goes in the helper's steps, and the floor
 * of the two pre-forked spawners the design weighs against today's one-exec-per-command helper
 * (sandboxd/isolation/exec/sandboxd_exec.c). Built and driven by bench/spawner/run.py.
 *
 *   spawner steps ROUNDS UID GID CWD NJOIN JOIN.. NNS NS..
 *       fork from this small process, do the helper's steps one by one in the child (join each
 *       cgroup file, reset oom_score_adj, setns each pin, setsid, drop uid/gid + no_new_privs,
 *       seccomp, chdir), timing each into a shared page, then execve /bin/true; print one line
 *       per step: its median, p10 and p90 in microseconds, and fork-to-reap.
 *
 *   spawner server UID GID CWD NJOIN JOIN.. NNS NS..      (root; SPAWNER_FD: a SOCK_SEQPACKET)
 *       the per-daemon pre-forked helper: for each request, clone(CLONE_PARENT) a child that
 *       does every step of the helper (join, oom, setns, setsid, drop, seccomp, chdir) and
 *       execs the command; the child is the caller's own child (it reaps it with waitpid).
 *
 *   spawner zygote UID GID CWD NJOIN JOIN.. NNS NS..      (root; SPAWNER_FD: a SOCK_SEQPACKET)
 *       the per-sandbox zygote: does join, oom, setns, drop and seccomp ONCE, then for each
 *       request clone(CLONE_PARENT)s a child that only does setsid, umask, chdir and execs.
 *
 *   spawner cgroup2 ROUNDS DIR      (root; DIR a cgroup v2 directory)
 *       fork-to-reap of a child that only exits, interleaved: plain fork; fork then the child
 *       writes "0" into DIR/cgroup.procs (the helper's join, on v2); clone3 with
 *       CLONE_INTO_CGROUP (the child starts in DIR, nothing to migrate).
 *
 * A request (both servers) is one message: the command's argv then its environment, each
 * string NUL-terminated, an empty string between the two, with three descriptors (SCM_RIGHTS)
 * for the command's stdin, stdout and stderr. The answer is the child's pid as a native int
 * (negative: -errno), with the child's pidfd attached (SCM_RIGHTS) when SPAWNER_PIDFD is set
 * in the server's environment (clone's CLONE_PIDFD). The uid, gid, cwd, joins and pins come
 * from the server's own arguments here, for brevity; a real server would take them per request (the server) or at its start
 * (the zygote, which is one sandbox's).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../sandboxd/isolation/exec/sandboxd_seccomp.h"

#define SETUP_FAILED 125
#define MAX_STEPS 24
#define MAX_ROUNDS 4000

extern char **environ;

struct setup {
    uid_t uid;
    gid_t gid;
    const char *cwd;
    int njoin;
    char **join;
    int nns;
    char **ns;
};

static void die(const char *what)
{
    dprintf(2, "spawner: %s: %s\n", what, strerror(errno));
    _exit(SETUP_FAILED);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void parse_setup(int argc, char **argv, int first, struct setup *s)
{
    if (argc < first + 5)
        die("usage");
    s->uid = (uid_t)atol(argv[first]);
    s->gid = (gid_t)atol(argv[first + 1]);
    s->cwd = argv[first + 2];
    s->njoin = atoi(argv[first + 3]);
    s->join = argv + first + 4;
    if (argc < first + 5 + s->njoin)
        die("usage");
    s->nns = atoi(argv[first + 4 + s->njoin]);
    s->ns = argv + first + 5 + s->njoin;
}

/* The helper's steps, as sandboxd_exec.c does them. */
static void join_one(const char *path)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0\n", 2) != 2)
        die(path);
    close(fd);
}

static void oom_reset(void)
{
    int fd = open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        die("oom_score_adj");
    if (write(fd, "0", 1) != 1)
        die("oom_score_adj");
    close(fd);
}

static int ns_type(const char *path)
{
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    if (strcmp(name, "ipc") == 0)
        return CLONE_NEWIPC;
    if (strcmp(name, "mnt") == 0)
        return CLONE_NEWNS;
    if (strcmp(name, "net") == 0)
        return CLONE_NEWNET;
    return 0;
}

static void enter_one(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, ns_type(path)) != 0)
        die(path);
    close(fd);
}

static void drop(uid_t uid, gid_t gid)
{
    if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0)
        die("drop");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        die("no_new_privs");
}

static void filter(void)
{
    static struct program program;
    if (build_filter(&program) != 0)
        die("seccomp filter");
    struct sock_fprog fprog = {.len = (unsigned short)program.length, .filter = program.insns};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0)
        die("seccomp");
}

/* steps: each step's time in a forked child. */
static const char **step_name; /* shared: the child names its steps (pointers valid in both) */
static int nsteps;

static void mark(int64_t *slot, int64_t *last, int index, const char *name)
{
    int64_t t = now_ns();
    slot[index] = t - *last;
    step_name[index] = name;
    *last = t;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int steps(int argc, char **argv)
{
    int rounds = atoi(argv[2]);
    if (rounds < 1 || rounds > MAX_ROUNDS)
        die("rounds");
    struct setup s;
    parse_setup(argc, argv, 3, &s);
    size_t size = sizeof(int64_t) * MAX_STEPS * MAX_ROUNDS;
    int64_t *shared = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    step_name = mmap(NULL, sizeof(char *) * MAX_STEPS, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED || step_name == MAP_FAILED)
        die("mmap");
    static int64_t total[MAX_ROUNDS];
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    char *true_argv[] = {"true", NULL};
    char *env[] = {"PATH=/usr/bin:/bin", NULL};
    for (int r = 0; r < rounds; r++) {
        int64_t start = now_ns();
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            int64_t *slot = shared + (size_t)r * MAX_STEPS, last = start;
            int i = 0;
            mark(slot, &last, i++, "fork (until the child runs)");
            for (int j = 0; j < s.njoin; j++) {
                join_one(s.join[j]);
                mark(slot, &last, i++, s.join[j]);
            }
            oom_reset();
            mark(slot, &last, i++, "oom_score_adj reset");
            for (int j = 0; j < s.nns; j++) {
                enter_one(s.ns[j]);
                mark(slot, &last, i++, s.ns[j]);
            }
            if (setsid() < 0)
                die("setsid");
            mark(slot, &last, i++, "setsid");
            drop(s.uid, s.gid);
            mark(slot, &last, i++, "setgroups+setresgid+setresuid+no_new_privs");
            filter();
            mark(slot, &last, i++, "seccomp (build + install)");
            if (chdir(s.cwd) != 0)
                die("chdir");
            umask(077);
            mark(slot, &last, i++, "chdir + umask");
            slot[MAX_STEPS - 1] = i;
            dup2(devnull, 0);
            dup2(devnull, 1);
            execve("/bin/true", true_argv, env);
            die("execve");
        }
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            die("child failed");
        total[r] = now_ns() - start;
    }
    nsteps = (int)shared[MAX_STEPS - 1];
    static int64_t column[MAX_ROUNDS];
    int64_t sum = 0;
    for (int k = 0; k < nsteps; k++) {
        for (int r = 0; r < rounds; r++)
            column[r] = shared[(size_t)r * MAX_STEPS + k];
        qsort(column, (size_t)rounds, sizeof column[0], cmp64);
        sum += column[rounds / 2];
        const char *name = step_name[k], *slash;
        char label[64];
        if (strncmp(name, "/sys/fs/cgroup/", 15) == 0 && (slash = strchr(name + 15, '/')))
            snprintf(label, sizeof label, "join cgroup (v1 %.*s tasks)", (int)(slash - name - 15),
                     name + 15);
        else if ((slash = strrchr(name, '/')) != NULL)
            snprintf(label, sizeof label, "setns %s", slash + 1);
        else
            snprintf(label, sizeof label, "%s", name);
        printf("%-48s p50 %8.1f us  p10 %8.1f  p90 %8.1f\n", label,
               column[rounds / 2] / 1e3, column[rounds / 10] / 1e3, column[rounds * 9 / 10] / 1e3);
    }
    printf("%-48s p50 %8.1f us\n", "sum of step p50s (fork .. before execve)", sum / 1e3);
    qsort(total, (size_t)rounds, sizeof total[0], cmp64);
    printf("%-48s p50 %8.1f us  p10 %8.1f  p90 %8.1f\n", "fork to reap (whole, incl. execve true)",
           total[rounds / 2] / 1e3, total[rounds / 10] / 1e3, total[rounds * 9 / 10] / 1e3);
    return 0;
}

/* The servers. */
static void prepare_child(const struct setup *s, int full)
{
    if (full) {
        for (int j = 0; j < s->njoin; j++)
            join_one(s->join[j]);
        oom_reset();
        for (int j = 0; j < s->nns; j++)
            enter_one(s->ns[j]);
    }
    if (setsid() < 0)
        die("setsid");
    if (full) {
        drop(s->uid, s->gid);
        filter();
    }
    umask(077);
    if (chdir(s->cwd) != 0)
        die("chdir");
}

#define MSG_MAX 65536

static int serve(int argc, char **argv, int zygote)
{
    struct setup s;
    parse_setup(argc, argv, 2, &s);
    if (zygote) {
        for (int j = 0; j < s.njoin; j++)
            join_one(s.join[j]);
        oom_reset();
        for (int j = 0; j < s.nns; j++)
            enter_one(s.ns[j]);
        drop(s.uid, s.gid);
        filter();
    }
    const char *fd_text = getenv("SPAWNER_FD");
    int sock = fd_text ? atoi(fd_text) : 3;
    int want_pidfd = getenv("SPAWNER_PIDFD") != NULL;
    static char buf[MSG_MAX + 1];
    for (;;) {
        int fds[3] = {-1, -1, -1};
        char control[CMSG_SPACE(sizeof fds)];
        struct iovec iov = {.iov_base = buf, .iov_len = MSG_MAX};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = control,
                             .msg_controllen = sizeof control};
        ssize_t got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (got <= 0)
            return 0;
        buf[got] = '\0';
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        if (c == NULL || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof fds))
            die("request without three descriptors");
        memcpy(fds, CMSG_DATA(c), sizeof fds);
        char *args[1024], *env[1024];
        int na = 0, ne = 0, in_env = 0;
        for (char *p = buf; p < buf + got; p += strlen(p) + 1) {
            if (*p == '\0' && !in_env) {
                in_env = 1;
                continue;
            }
            if (in_env && ne < 1023)
                env[ne++] = p;
            else if (!in_env && na < 1023)
                args[na++] = p;
        }
        args[na] = NULL;
        env[ne] = NULL;
        /* The child is the caller's: it gets SIGCHLD and reaps it. */
        /* With SPAWNER_PIDFD set, CLONE_PIDFD too: the answer carries the child's pidfd. */
        int pidfd = -1;
        unsigned long flags = CLONE_PARENT | (want_pidfd ? CLONE_PIDFD : 0);
        pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, want_pidfd ? &pidfd : NULL, NULL, NULL);
        if (pid == 0) {
            for (int k = 0; k < 3; k++)
                if (dup2(fds[k], k) < 0)
                    _exit(SETUP_FAILED);
            close(sock);
            prepare_child(&s, !zygote);
            environ = env;
            execvp(args[0], args);
            _exit(errno == ENOENT ? 127 : 126);
        }
        int answer = pid < 0 ? -errno : pid;
        for (int k = 0; k < 3; k++)
            close(fds[k]);
        char reply_control[CMSG_SPACE(sizeof pidfd)];
        struct iovec reply_iov = {.iov_base = &answer, .iov_len = sizeof answer};
        struct msghdr reply = {.msg_iov = &reply_iov, .msg_iovlen = 1};
        if (pidfd >= 0) {
            reply.msg_control = reply_control;
            reply.msg_controllen = sizeof reply_control;
            struct cmsghdr *rc = CMSG_FIRSTHDR(&reply);
            rc->cmsg_level = SOL_SOCKET;
            rc->cmsg_type = SCM_RIGHTS;
            rc->cmsg_len = CMSG_LEN(sizeof pidfd);
            memcpy(CMSG_DATA(rc), &pidfd, sizeof pidfd);
        }
        ssize_t sent = sendmsg(sock, &reply, 0);
        if (pidfd >= 0)
            close(pidfd);
        if (sent != (ssize_t)sizeof answer)
            return 0;
    }
}

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

struct clone_args_v2 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};

static int cgroup2(int argc, char **argv)
{
    if (argc != 4)
        die("usage: cgroup2 ROUNDS DIR");
    int rounds = atoi(argv[2]);
    if (rounds < 1 || rounds > MAX_ROUNDS)
        die("rounds");
    char procs[4096];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", argv[3]);
    int dir = open(argv[3], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        die(argv[3]);
    static int64_t times[3][MAX_ROUNDS];
    static const char *const names[3] = {"fork, exit", "fork, join v2 cgroup.procs, exit",
                                         "clone3 CLONE_INTO_CGROUP, exit"};
    for (int r = 0; r < rounds; r++) {
        for (int way = 0; way < 3; way++) {
            int64_t start = now_ns();
            pid_t pid;
            if (way == 2) {
                struct clone_args_v2 args = {.flags = CLONE_INTO_CGROUP,
                                             .exit_signal = SIGCHLD,
                                             .cgroup = (uint64_t)dir};
                pid = (pid_t)syscall(SYS_clone3, &args, sizeof args);
            } else {
                pid = fork();
            }
            if (pid < 0)
                die("fork/clone3");
            if (pid == 0) {
                if (way == 1)
                    join_one(procs);
                _exit(0);
            }
            int status;
            if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
                die("child failed");
            times[way][r] = now_ns() - start;
        }
    }
    for (int way = 0; way < 3; way++) {
        qsort(times[way], (size_t)rounds, sizeof times[way][0], cmp64);
        printf("%-48s p50 %8.1f us  p10 %8.1f  p90 %8.1f\n", names[way],
               times[way][rounds / 2] / 1e3, times[way][rounds / 10] / 1e3,
               times[way][rounds * 9 / 10] / 1e3);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "cgroup2") == 0)
        return cgroup2(argc, argv);
    if (argc >= 3 && strcmp(argv[1], "steps") == 0)
        return steps(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "server") == 0)
        return serve(argc, argv, 0);
    if (argc >= 2 && strcmp(argv[1], "zygote") == 0)
        return serve(argc, argv, 1);
    dprintf(2, "usage: spawner steps|server|zygote ...\n");
    return SETUP_FAILED;
}
