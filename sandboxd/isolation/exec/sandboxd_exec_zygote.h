/*
 * sandboxd-exec's per-sandbox zygote (included by sandboxd_exec.c; the daemon's side is
 * sandboxd/isolation/exec/zygotes.py, docs/operating.rst "Zygotes").
 *
 *   sandboxd-exec zygote HELPER-ARGV..   (a spawn server's request: its child, the daemon's own)
 *
 * HELPER-ARGV is an exec's own helper argv from its first argument on ("enter N NS.. HELPER
 * [--OPTION..] sandbox UID GID CWD N JOIN.. CMD.."). The zygote first joins the JOIN files (so
 * that everything it touches from then on is charged to the sandbox) and resets its
 * oom_score_adj (its /proc/self is out of sight past a pid namespace's setns), then takes every
 * other step of the helper but the last, in the helper's order: setns into each NS (a pid namespace too: the
 * zygote stays outside it, where the sandbox cannot address it, and its children are born
 * inside; no relay), the joins, oom_score_adj 0, a session of its own, the privilege drop and
 * no_new_privs, not dumpable (so no process of the sandbox's uid can ptrace it or read its
 * descriptors), the seccomp filter. Then it serves its stdin (one end of a SOCK_SEQPACKET
 * socketpair) exactly as the spawn server serves its own: each message is an exec's helper argv
 * and environment with its three descriptors (SCM_RIGHTS, taken MSG_CMSG_CLOEXEC), each gets a
 * clone(CLONE_PARENT) child (the daemon's own, reaped by it; in the sandbox's pid namespace
 * when it has one), and the answer is the child's pid or -errno (EAGAIN at pids.max). The child
 * puts the descriptors on 0, 1 and 2, closes every other, leads a new session, and does the
 * helper's last step on the request's CWD, umask and CMD: its environment unpacked, PWD, exit 2
 * for a CWD it cannot enter, 126 and 127 with the helper's messages. The zygote ends at the end
 * of its stdin (the daemon retires it, or has gone).
 */

/* zygote_mode (declared in sandboxd_exec.c): set in a zygote; "enter" then takes no relay into
 * a pid namespace (its children are born there). */

/* The "sandbox" part of a helper argv (ARGV[0] "HELPER" or "zygote", then "enter N NS.." or
 * not): a pointer to its HELPER, and its count in *ARGC. */
static char **zygote_sandbox_part(int *argc, char **argv)
{
    if (*argc < 3 || strcmp(argv[1], "enter") != 0)
        return argv;
    char *end = NULL;
    long count = strtol(argv[2], &end, 10);
    if (end == argv[2] || *end != '\0' || count < 0 || count > *argc - 4)
        fail(SETUP_FAILED, "bad", "namespace count", EINVAL);
    *argc -= 3 + (int)count;
    return argv + 3 + count;
}

/* A request's child: descriptors on 0, 1, 2, nothing else open, a session of its own, then the
 * helper's last step on the request's own CWD, options and CMD. */
static void zygote_child(const int fds[3], int argc, char **argv, char **env)
{
    for (int k = 0; k < 3; k++)
        if (dup2(fds[k], k) < 0)
            _exit(SETUP_FAILED);
    spawn_close_others();
    if (setsid() < 0)
        fail(SETUP_FAILED, "setsid", NULL, errno);
    environ = env;
    argv = zygote_sandbox_part(&argc, argv);
    struct options options = {.umask = 077, .seccomp = 1, .no_ptrace = 0, .ctty = 0};
    int used = parse_options(argc, argv, &options);
    argc -= used;
    argv += used;
    if (options.ctty || options.no_ptrace)
        fail(SETUP_FAILED, "zygote", "a terminal's or the daemon's own command", EINVAL);
    char *end = NULL;
    long procs = argc >= 7 ? strtol(argv[5], &end, 10) : -1;
    if (strcmp(argv[1], "sandbox") != 0 || end == argv[5] || *end != '\0' || procs < 0 ||
        procs > argc - 7)
        fail(SETUP_FAILED, "bad", "zygote request", EINVAL);
    _exit(run(argv[4], argv + 6 + procs, 1, options.umask, 0));
}

/* The zygote's first step, before any other: join the JOIN files of ARGV (its sandbox part) by
 * path, while they are in sight. */
static void zygote_join_first(int argc, char **argv)
{
    char **part = zygote_sandbox_part(&argc, argv);
    relay_join_cgroups(argc, part);
}

/* After the helper's steps: not dumpable, named "sandboxd-zygote" (its comm: ps shows it so),
 * then serve the execs of the sandbox on stdin. */
static int serve_zygote(void)
{
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        fail(SETUP_FAILED, "PR_SET_DUMPABLE", NULL, errno);
    prctl(PR_SET_NAME, "sandboxd-zygote", 0, 0, 0);
    static char buf[SPAWN_MESSAGE_MAX + 1];
    static char *args[SPAWN_ARGS_MAX + 2];
    while (spawn_one(0, buf, args, zygote_child) == 0)
        ;
    return 0;
}
