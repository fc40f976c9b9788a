/*
 * sandboxd-exec: start one command of a sandbox in a single exec, with no shell in between.
 *
 *   sandboxd-exec [--umask=OCTAL] [--seccomp=default|off] [--no-ptrace] [--ctty] sandbox UID GID CWD N JOIN_1 .. JOIN_N CMD [ARG..]
 *   sandboxd-exec [--umask=OCTAL] [--ctty] session CWD CMD [ARG..]
 *   sandboxd-exec seccomp-check | seccomp-dump
 *   sandboxd-exec enter N NS_1 .. NS_N sandboxd-exec [--umask=..] sandbox ...   (sandboxd_exec_ns.h)
 *   sandboxd-exec namespaces NSROOT RID KINDS TMP WORKSPACE SHM_BYTES [KEEP..]   (sandboxd_exec_ns.h)
 *   sandboxd-exec namespace-server   (sandboxd_exec_ns.h)
 *   sandboxd-exec spawn-server   (sandboxd_exec_spawn.h: each request runs this main path in a child)
 *   sandboxd-exec zygote enter N NS.. HELPER sandbox ...   (sandboxd_exec_zygote.h: a spawn
 *       server's child that takes the steps, then forks each exec of the sandbox)
 *
 * "sandbox" (run as root by the isolated daemon), in this order:
 *   1. write 0 (itself) into every JOIN file (the sandbox's cgroup.procs, or each v1 hierarchy's
 *      tasks: a single thread moving itself skips the kernel's global threadgroup lock, whose
 *      writers wait for an RCU grace period): everything the command ever forks is inside the
 *      limits;
 *   2. reset oom_score_adj to 0 (the daemon's protective value would be inherited; a value
 *      above 0 that cannot be lowered is kept, as it protects nothing);
 *   3. setsid (a new session and process group that the daemon can killpg; a command forked
 *      into a pid namespace stays in the session its relay leads, sandboxd_exec_ns.h); with
 *      --ctty (a terminal: fd 0 is the slave of a pseudo-terminal), a process that leads its
 *      session already (the spawner made it so) keeps it, and fd 0 is made the session's
 *      controlling terminal (TIOCSCTTY): Ctrl-C, SIGWINCH and job control reach the command;
 *   4. drop every supplementary group, then gid, then uid (real, effective, saved), and set
 *      no_new_privs (setuid programs no longer raise privilege); then, unless --seccomp=off,
 *      apply the default seccomp filter (sandboxd_seccomp.h says what it refuses);
 *   5. chdir(CWD) as the sandbox's uid, so a CWD the sandbox swapped for a symlink gets it
 *      nothing its uid could not reach anyway;
 *   6. set the umask (--umask, default 077: nothing the command creates is readable by another
 *      uid unless it says so) and execvp CMD with the command's environment and PWD=CWD (with
 *      --no-ptrace, for what the daemon starts as the sandbox for its own work, CMD is executed
 *      from an execute-only copy, so no process of the sandbox can ptrace it:
 *      sandboxd_exec_noptrace.h).
 * A failure in steps 1-4 exits 125 with "sandboxd-exec: ..." on stderr and the command never
 * starts. "session" (the unisolated mode) does steps 3, 5 and 6 only, and passes the environment
 * as it is.
 *
 * "seccomp-check" applies the filter to itself and checks that the kernel enforces it (start-up
 * runs it: exit 0 and "seccomp: enforced", else 125 and why). "seccomp-dump" writes the filter
 * program (struct sock_filter[]) to stdout, for the tests that read it.
 *
 * The command's environment must not act on this root process: it arrives either made only of
 * names no program here acts on, or carried as __SANDBOXD_N=count and __SANDBOXD_<i>=NAME=VALUE
 * entries (see sandboxd/isolation/exec/wrapper.py), which are unpacked here for the command alone.
 *
 * Exit codes are the shell's: 2 when CWD cannot be entered, 127 when CMD is not found, 126
 * when it cannot be executed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandboxd_seccomp.h"

#define SETUP_FAILED 125
#define CWD_FAILED 2
#define NOT_EXECUTABLE 126
#define NOT_FOUND 127
#define PREFIX "__SANDBOXD_"

extern char **environ;

static void fail(int code, const char *what, const char *arg, int error);
static int open_for_writing(const char *path);
static void new_session(int ctty);
static int zygote_mode; /* sandboxd_exec_zygote.h */
#include "sandboxd_exec_ns.h" /* namespaces at create, and "enter" before an exec */
#include "sandboxd_exec_spawn.h" /* the spawn server: this main path, without a program start */
#include "sandboxd_exec_noptrace.h" /* --no-ptrace: the daemon's own work as a sandbox */

static void fail(int code, const char *what, const char *arg, int error)
{
    if (arg != NULL)
        dprintf(2, "sandboxd-exec: %s %s: %s\n", what, arg, strerror(error));
    else
        dprintf(2, "sandboxd-exec: %s: %s\n", what, strerror(error));
    _exit(code);
}

static long number(const char *text, const char *what)
{
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    /* Never 0 (root), never past what uid_t and gid_t hold ((uid_t)-1 means "unchanged"). */
    if (errno != 0 || end == text || *end != '\0' || value <= 0 || value >= 0xffffffffL)
        fail(SETUP_FAILED, "bad", what, EINVAL);
    return value;
}

/* PATH opened for writing; "fd:N" names descriptor N, opened before the root was switched
 * (a cgroup file of the host's, out of sight in a template's root: sandboxd_exec_ns.h). */
static int open_for_writing(const char *path)
{
    if (strncmp(path, "fd:", 3) == 0)
        return fcntl(atoi(path + 3), F_DUPFD_CLOEXEC, 3);
    return open(path, O_WRONLY | O_CLOEXEC);
}

static void write_all(const char *path, const char *text, const char *what)
{
    int fd = open_for_writing(path);
    if (fd < 0)
        fail(SETUP_FAILED, what, path, errno);
    size_t length = strlen(text);
    ssize_t written = write(fd, text, length);
    int error = errno;
    close(fd);
    if (written != (ssize_t)length)
        fail(SETUP_FAILED, what, path, written < 0 ? error : EIO);
}

static void reset_oom_score_adj(void)
{
    int fd = open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        fail(SETUP_FAILED, "cannot reset oom_score_adj", NULL, errno);
    if (write(fd, "0", 1) == 1) {
        close(fd);
        return;
    }
    char value[32] = {0};
    ssize_t got = pread(fd, value, sizeof value - 1, 0);
    close(fd);
    if (got <= 0 || value[0] == '-')
        fail(SETUP_FAILED, "cannot reset oom_score_adj", NULL, EPERM);
}

static int dies_with_relay = 0;

static void drop_privilege(uid_t uid, gid_t gid)
{
    if (setgroups(0, NULL) != 0)
        fail(SETUP_FAILED, "setgroups", NULL, errno);
    if (setresgid(gid, gid, gid) != 0)
        fail(SETUP_FAILED, "setresgid", NULL, errno);
    if (setresuid(uid, uid, uid) != 0)
        fail(SETUP_FAILED, "setresuid", NULL, errno);
    uid_t r, e, s;
    if (getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid)
        fail(SETUP_FAILED, "setresuid", "did not hold", EPERM);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        fail(SETUP_FAILED, "no_new_privs", NULL, errno);
    /* After the credentials changed (which clears it): a terminal's command in a pid
     * namespace dies with its relay, whose SIGKILL cannot be passed on (relay_signals). */
    if (dies_with_relay && prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        fail(SETUP_FAILED, "PR_SET_PDEATHSIG", NULL, errno);
}

struct options {
    mode_t umask;
    int seccomp;
    int no_ptrace;
    int ctty;
};

/* Step 3: a new session (kept if this process leads one already and ``ctty``), and with
 * ``ctty`` fd 0 (a terminal) as its controlling terminal. */
static void new_session(int ctty)
{
    if (!(ctty && getsid(0) == getpid()) && setsid() < 0)
        fail(SETUP_FAILED, "setsid", NULL, errno);
    if (ctty && ioctl(0, TIOCSCTTY, 0) != 0)
        fail(SETUP_FAILED, "TIOCSCTTY", "fd 0", errno);
}

/* Leading --umask=OCTAL, --seccomp=default|off and --no-ptrace; the number of arguments they
 * took. */
static int parse_options(int argc, char **argv, struct options *options)
{
    int used = 0;
    while (used + 1 < argc && strncmp(argv[used + 1], "--", 2) == 0) {
        const char *option = argv[used + 1];
        if (strncmp(option, "--umask=", 8) == 0) {
            char *end = NULL;
            errno = 0;
            long mask = strtol(option + 8, &end, 8);
            if (errno != 0 || end == option + 8 || *end != '\0' || mask < 0 || mask > 0777)
                fail(SETUP_FAILED, "bad", option, EINVAL);
            options->umask = (mode_t)mask;
        } else if (strcmp(option, "--seccomp=default") == 0) {
            options->seccomp = 1;
        } else if (strcmp(option, "--seccomp=off") == 0) {
            options->seccomp = 0;
        } else if (strcmp(option, "--no-ptrace") == 0) {
            options->no_ptrace = 1;
        } else if (strcmp(option, "--ctty") == 0) {
            options->ctty = 1;
        } else {
            fail(SETUP_FAILED, "bad option", option, EINVAL);
        }
        used++;
    }
    return used;
}

static void apply_seccomp(void)
{
    static struct program program;
    if (build_filter(&program) != 0)
        fail(SETUP_FAILED, "seccomp filter", NULL, errno);
    struct sock_fprog fprog = {.len = (unsigned short)program.length, .filter = program.insns};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0)
        fail(SETUP_FAILED, "seccomp", NULL, errno);
}

/* One expectation of seccomp_check: the call answered -1 with errno ``wanted``. */
static void expect(long result, int wanted, const char *what)
{
    int error = errno;
    if (result != -1 || error != wanted) {
        dprintf(2, "sandboxd-exec: seccomp not enforced: %s answered %ld (%s)\n", what, result,
                result == -1 ? strerror(error) : "success");
        _exit(SETUP_FAILED);
    }
}

static int seccomp_check(void)
{
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        fail(SETUP_FAILED, "no_new_privs", NULL, errno);
    apply_seccomp();
    expect(unshare(CLONE_NEWUSER), EPERM, "unshare(CLONE_NEWUSER)");
    expect(syscall(__NR_clone3, NULL, 0), ENOSYS, "clone3");
    expect(socket(AF_PACKET, SOCK_RAW, 0), EAFNOSUPPORT, "socket(AF_PACKET)");
    expect(syscall(__NR_keyctl, 0, -3, 0), EPERM, "keyctl");
    dprintf(1, "seccomp: enforced\n");
    return 0;
}

static int seccomp_dump(void)
{
    static struct program program;
    if (build_filter(&program) != 0)
        fail(SETUP_FAILED, "seccomp filter", NULL, errno);
    size_t size = program.length * sizeof program.insns[0];
    if (write(1, program.insns, size) != (ssize_t)size)
        fail(SETUP_FAILED, "seccomp-dump", NULL, errno);
    return 0;
}

/* The command's environment: the carried entries if there are any (and ``unpack``), else ours
 * as it is; PWD is set to CWD either way (as a shell's cd would). */
static char **command_env(const char *cwd, int unpack)
{
    const char *carried = unpack ? getenv(PREFIX "N") : NULL;
    size_t count = 0;
    while (environ[count] != NULL)
        count++;
    if (carried != NULL) {
        size_t listed = (size_t)strtoul(carried, NULL, 10);
        if (listed > count)
            fail(SETUP_FAILED, "environment", PREFIX "N", EINVAL);
        count = listed;
    }
    char **env = calloc(count + 2, sizeof *env);
    if (env == NULL)
        fail(SETUP_FAILED, "environment", NULL, ENOMEM);
    size_t used = 0;
    for (size_t i = 0; i < count; i++) {
        const char *entry = environ[i];
        if (carried != NULL) {
            char name[48];
            snprintf(name, sizeof name, PREFIX "%zu", i);
            entry = getenv(name);
        }
        if (entry == NULL || strncmp(entry, "PWD=", 4) == 0)
            continue;
        env[used++] = (char *)entry;
    }
    char *pwd = malloc(strlen(cwd) + 5);
    if (pwd == NULL)
        fail(SETUP_FAILED, "environment", NULL, ENOMEM);
    strcpy(pwd, "PWD=");
    strcat(pwd, cwd);
    env[used++] = pwd;
    env[used] = NULL;
    return env;
}

static int run(const char *cwd, char **argv, int unpack, mode_t mask, int no_ptrace)
{
    char **env = command_env(cwd, unpack);
    umask(mask);
    if (chdir(cwd) != 0)
        fail(CWD_FAILED, "cd", cwd, errno);
    environ = env; /* execvp searches the command's own PATH */
    if (no_ptrace)
        noptrace_exec(argv, env);
    else
        execvp(argv[0], argv);
    int error = errno;
    int code = (error == ENOENT || error == ENOTDIR) ? NOT_FOUND : NOT_EXECUTABLE;
    dprintf(2, "sandboxd-exec: %s: %s\n", argv[0],
            code == NOT_FOUND ? "command not found" : strerror(error));
    return code;
}

#include "sandboxd_exec_zygote.h" /* a zygote: the steps once, then a fork per exec */

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "namespace-server") == 0)
        return serve_namespaces();
    if (argc == 2 && strcmp(argv[1], "spawn-server") == 0)
        return serve_spawns();
    return helper_main(argc, argv);
}

/* Everything but the servers (a spawn server's child runs this on the request's argv). */
static int helper_main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "zygote") == 0) {
        zygote_mode = 1;
        argc--;
        argv++;
        zygote_join_first(argc, argv);
        reset_oom_score_adj(); /* here: past "enter", a pid namespace's /proc has no "self" */
    }
    if (argc >= 2 && strcmp(argv[1], "enter") == 0)
        argv = enter_namespaces(&argc, argv);
    if (argc >= 2 && strcmp(argv[1], "namespaces") == 0)
        return make_namespaces(argc, argv, 0); /* once: a template would cost a copy too */
    struct options options = {.umask = 077, .seccomp = 1, .no_ptrace = 0, .ctty = 0};
    int used = parse_options(argc, argv, &options);
    argc -= used;
    argv += used;
    if (argc == 2 && strcmp(argv[1], "seccomp-check") == 0)
        return seccomp_check();
    if (argc == 2 && strcmp(argv[1], "seccomp-dump") == 0)
        return seccomp_dump();
    if (argc >= 4 && strcmp(argv[1], "session") == 0) {
        new_session(options.ctty);
        return run(argv[2], argv + 3, 0, options.umask, 0);
    }
    if (argc < 7 || strcmp(argv[1], "sandbox") != 0) {
        dprintf(2, "usage: sandboxd-exec sandbox UID GID CWD N JOIN.. CMD [ARG..]\n"
                   "       sandboxd-exec session CWD CMD [ARG..]\n");
        return SETUP_FAILED;
    }
    uid_t uid = (uid_t)number(argv[2], "uid");
    gid_t gid = (gid_t)number(argv[3], "gid");
    const char *cwd = argv[4];
    char *end = NULL;
    long procs = strtol(argv[5], &end, 10);
    if (end == argv[5] || *end != '\0' || procs < 0 || procs > argc - 7)
        fail(SETUP_FAILED, "bad", "procs count", EINVAL);
    for (long i = 0; i < procs; i++)
        write_all(argv[6 + i], "0\n", "cannot join cgroup");
    if (!zygote_mode)
        reset_oom_score_adj();
    /* A relayed command is in its relay's session already, but a terminal's leads its own
     * (relay_release_terminal), and dies with its relay (relay_signals). */
    if (!ns_relayed || options.ctty)
        new_session(options.ctty);
    dies_with_relay = ns_relayed && options.ctty;
    drop_privilege(uid, gid);
    if (options.seccomp)
        apply_seccomp();
    if (zygote_mode)
        return serve_zygote();
    return run(cwd, argv + 6 + procs, 1, options.umask, options.no_ptrace);
}
