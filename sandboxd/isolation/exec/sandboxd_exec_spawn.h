/*
 * sandboxd-exec's spawn server (included by sandboxd_exec.c; see sandboxd/core/exec/server.py).
 *
 *   sandboxd-exec spawn-server      (root; its stdin is one end of a SOCK_SEQPACKET socketpair)
 *
 * One long-running process the daemon starts (like namespace-server), which starts each
 * isolated command without a program start of its own. Each request is one message:
 *
 *   ARGC NUL  ARG_0 NUL .. ARG_{ARGC-1} NUL  ENV_0 NUL .. ENV_M NUL
 *
 * (ARGC in decimal; the arguments are exactly the helper's argv today, ARG_0 the helper's
 * path; the ENV entries are the helper's environment today), with three descriptors
 * (SCM_RIGHTS): the command's stdin, stdout and stderr. For each, the server clones a child with
 * CLONE_PARENT, so the child is the daemon's own (it gets SIGCHLD and reaps it, as a child it
 * spawned itself). The child puts the three descriptors on 0, 1 and 2, closes every other one,
 * takes ENV as its environment and runs the helper's main path on ARGV: every step, message and
 * exit code is the helper's. The answer is one native int: the child's pid, or -errno when no
 * child was made (EAGAIN, ENOMEM from clone; EBADMSG, EMSGSIZE for a request it cannot read).
 *
 * A request whose ARG_1 is "zygote" starts a sandbox's zygote the same way
 * (sandboxd_exec_zygote.h): its child runs the helper's steps and then serves that sandbox's
 * execs on its stdin instead of exec'ing a command.
 *
 * The server resets every signal's disposition and its signal mask at start (the child's are
 * then what a program started by the daemon has), and ends at the end of its stdin.
 */
#include <sys/syscall.h>

#define SPAWN_MESSAGE_MAX (256 << 10)
#define SPAWN_ARGS_MAX 65536

static int helper_main(int argc, char **argv);

/* Every signal to its default action, none blocked. */
static void spawn_reset_signals(void)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &action, NULL); /* SIGKILL, SIGSTOP and the C library's own: refused */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

static void spawn_close_others(void)
{
    if (syscall(SYS_close_range, 3U, ~0U, 0U) == 0)
        return;
    for (int fd = 3, top = getdtablesize(); fd < top; fd++)
        close(fd);
}

/* The child: descriptors on 0, 1, 2, nothing else open, then the helper's own path. */
static void spawn_child(const int fds[3], int argc, char **argv, char **env)
{
    for (int k = 0; k < 3; k++)
        if (dup2(fds[k], k) < 0)
            _exit(SETUP_FAILED);
    spawn_close_others();
    environ = env;
    _exit(helper_main(argc, argv));
}

/* Split one request into argv and env (``args``: ARGC arguments, NULL, the environment, NULL;
 * pointers into ``buf``); -EBADMSG if it is malformed. */
static int spawn_parse(char *buf, size_t size, char **args, int *argc)
{
    if (size == 0 || buf[size - 1] != '\0')
        return -EBADMSG;
    char *end = NULL;
    long count = strtol(buf, &end, 10);
    if (end == buf || *end != '\0' || count < 1 || count >= SPAWN_ARGS_MAX - 1)
        return -EBADMSG;
    char *p = buf + strlen(buf) + 1, *stop = buf + size;
    long used = 0;
    for (; p < stop && used < SPAWN_ARGS_MAX - 1; used++, p += strlen(p) + 1)
        args[used < count ? used : used + 1] = p;
    if (p < stop || used < count)
        return -EBADMSG;
    args[count] = NULL;
    args[used + 1] = NULL;
    *argc = (int)count;
    return 0;
}

/* What a request's child runs: its descriptors, argv and environment; it never returns. */
typedef void (*spawn_child_fn)(const int fds[3], int argc, char **argv, char **env);

/* One request read, answered (its child runs ``child``); 0 to go on, -1 when the daemon has
 * gone. */
static int spawn_one(int sock, char *buf, char **args, spawn_child_fn child)
{
    int fds[3] = {-1, -1, -1};
    union {
        char space[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = buf, .iov_len = SPAWN_MESSAGE_MAX};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.space,
                         .msg_controllen = sizeof control.space};
    ssize_t got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR)
        return 0;
    if (got <= 0)
        return -1;
    int received = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof fd, sizeof fd);
            if (received < 3)
                fds[received] = fd;
            else
                close(fd);
            received++;
        }
    }
    int answer = 0, argc = 0;
    if (msg.msg_flags & MSG_TRUNC)
        answer = -EMSGSIZE;
    else if (received != 3 || (msg.msg_flags & MSG_CTRUNC))
        answer = -EBADMSG;
    else
        answer = spawn_parse(buf, (size_t)got, args, &argc);
    if (answer == 0) {
        pid_t pid = (pid_t)syscall(SYS_clone, CLONE_PARENT | SIGCHLD, NULL, NULL, NULL, NULL);
        if (pid == 0)
            child(fds, argc, args, args + argc + 1);
        answer = pid < 0 ? -errno : pid;
    }
    for (int k = 0; k < 3; k++)
        if (fds[k] >= 0)
            close(fds[k]);
    return send(sock, &answer, sizeof answer, MSG_NOSIGNAL) == (ssize_t)sizeof answer ? 0 : -1;
}

static int serve_spawns(void)
{
    /* 1 and 2 open (on /dev/null if they were not): the descriptors a request brings are then
     * all above 2, and none is dup2'd onto itself (which would keep its close-on-exec). */
    while (fcntl(1, F_GETFD) < 0 || fcntl(2, F_GETFD) < 0)
        if (open("/dev/null", O_RDWR) < 0)
            return SETUP_FAILED;
    spawn_reset_signals();
    static char buf[SPAWN_MESSAGE_MAX + 1];
    static char *args[SPAWN_ARGS_MAX + 2];
    while (spawn_one(0, buf, args, spawn_child) == 0)
        ;
    return 0;
}
