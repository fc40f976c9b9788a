/*
 * sandboxd-exec's namespace steps (included by sandboxd_exec.c; see sandboxd/isolation/namespaces/pins.py).
 *
 *   sandboxd-exec namespaces NSROOT RID KINDS TMP WORKSPACE SHM_BYTES [KEEP..]
 *   sandboxd-exec namespace-server
 *   sandboxd-exec enter N NS_1 .. NS_N HELPER MODE ...
 *
 * "namespaces" (run as root at create) makes one sandbox's namespaces and pins them, as
 * unshare(1) does: a child unshares the KINDS ("i" IPC, "m" mount, "n" network), and the parent
 * bind-mounts the child's /proc/PID/ns/{ipc,mnt,net} onto NSROOT/RID/{ipc,mnt,net} (files it
 * creates; NSROOT/RID must exist), then lets the child exit. The namespaces live as long as the
 * pins (or a process inside). In a new mount namespace the child first makes every mount a
 * slave (nothing it mounts reaches the host, the host's later mounts still arrive), detaches its
 * copy of NSROOT (so this namespace holds no other sandbox's pins), then binds TMP (the sandbox's
 * own tmp directory) onto /tmp and /var/tmp, mounts a tmpfs of SHM_BYTES (mode 1777) on
 * /dev/shm, and a fresh mqueue on /dev/mqueue where that exists. Where /home is a directory
 * it is covered by a small root-owned tmpfs (mode 0755) holding only "user", onto which
 * WORKSPACE (the sandbox's workspace) is bound: the host's /home is out of sight and the
 * workspace is /home/user. /run is a small tmpfs of its own holding only lock/ (mode 1777):
 * the host's sockets and run-time files are out of sight, while the file /etc/resolv.conf
 * names there is bound back (ns_private_run); /dev is a small tmpfs holding an allow-list of
 * the host's devices and no socket (ns_private_dev), made before /dev/shm and /dev/mqueue. Each
 * KEEP is a host directory directly inside one of those places
 * (the state root's, in test set-ups) that is bound back at its own path, with what is mounted
 * below it. Where NSROOT/RID holds "passwd" and "group" (the sandbox's, naming its uid), they
 * are bound over /etc/passwd and /etc/group; "ca-certificates.crt" likewise over
 * /etc/ssl/certs/ca-certificates.crt. Where it holds "root", the namespace's root is
 * switched to a template's (sandboxd_exec_root.h). A new network namespace gets its loopback up. The kernel pins a mount namespace
 * only when it is numbered above the pinner's own, and numbers them in per-CPU batches: a holder
 * whose new mount namespace is numbered too low makes it anew on another CPU, and the maker
 * moves to that CPU for the next ones (ns_number_above), so pinning works whichever CPU made
 * the daemon's own mount namespace (a pod's, a systemd unit's).
 *
 * "namespace-server" does the same for each line of its stdin (the arguments from NSROOT on,
 * separated by tabs), and answers each with one line on stdout: the exit
 * code, a tab, and what was written on stderr (newlines as spaces). It ends at EOF. The daemon
 * keeps one running, so a create costs no program start and no process but the holder. Its new
 * mount namespaces are not copies of the host's (which holds three pins per live sandbox, so
 * that each copy, and the detach that trims it, would cost more the more sandboxes live): at
 * the first request for an NSROOT it makes a template, once, as "namespaces" makes a sandbox's
 * (a copy of its own, every mount a slave, NSROOT detached), kept by a descriptor only; each
 * holder enters the template and copies that. The template never holds a pin (NSROOT is
 * private on the host's side, and detached here), so each copy costs the same however many
 * sandboxes live; the host's later mounts reach it (and every sandbox made from it) as they
 * reach a sandbox, by slave propagation. (So a later host mount in a place that does not
 * propagate is seen by no sandbox made after the template, as by none made before it; and a
 * filesystem the host unmounts there stays busy, held by the template, until the server ends.
 * "namespaces" alone copies its caller's: a template would cost one more copy.)
 *
 * "enter" opens each NS_i and enters it with setns (the caller lists the mount namespace last:
 * past it the other pins are no longer visible), then carries on as "HELPER MODE ...": the
 * privilege drop comes after, so a sandbox's commands never run outside its namespaces.
 *
 * PID namespace (KINDS "p", with "m"): the holder's unshare takes CLONE_NEWPID too, and once
 * the mount namespace is ready the holder forks the namespace's init (pid 1), which mounts a
 * /proc of that pid namespace on /proc (in the sandbox's mount namespace: the sandbox sees its
 * own processes only), points its stdio at /dev/null, ignores every signal (SIGCHLD ignored:
 * the kernel reaps the orphans it inherits) and sleeps for ever. The pin NSROOT/RID/pid is the
 * holder's /proc/PID/ns/pid_for_children, and NSROOT/RID/init holds init's pid (as the host
 * sees it): the daemon kills it at the sandbox's end, and the kernel then kills every process
 * left in the namespace. setns into a pid namespace only moves the caller's children, so
 * "enter" with a pin named "pid" becomes a relay (relay_pid_namespace): it leads a new
 * session, forks the command into the namespace (in the relay's own process group: the
 * daemon's killpg of the relay's pid reaches the command and what it forks, as without the
 * pid namespace), joins the sandbox's cgroups (the JOIN files of the "sandbox" arguments),
 * keeps every signal blocked (passing on those that came before the fork), and exits as the
 * command did. With --ctty (a terminal) the command leads a session of its own instead
 * (relay_release_terminal, relay_signals).
 *
 * Failures exit 125 with "sandboxd-exec: ..." on stderr.
 */
#include <limits.h>
#include <linux/types.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define NS_KEEP_MAX 8

#ifndef NS_GET_MNTNS_ID
#define NS_GET_MNTNS_ID _IOR(0xb7, 0x5, __u64)
#endif

static const char *const NS_PLACES[] = {"/tmp", "/var/tmp", "/dev/shm"};
static const char NS_HOME[] = "/home", NS_HOME_USER[] = "/home/user";
/* The sandbox's passwd and group, then (for a sandbox of the egress mode: egress_tls.py) the
 * CA bundle its programs read, the host's, with the daemon's CA while it has a header rule. */
static const char *const NS_IDENTITY[] = {"/etc/passwd", "/etc/group",
                                          "/etc/ssl/certs/ca-certificates.crt"};
static const char *const NS_IDENTITY_FILE[] = {"passwd", "group",
                                               "ca-certificates.crt"}; /* beside the pins */
static const char NS_RUN[] = "/run", NS_RUN_LOCK[] = "/run/lock", NS_VAR_RUN[] = "/var/run";
static const char NS_RUN_DATA[] = "size=1m,nr_inodes=256,mode=0755";
static const char NS_RESOLV[] = "/etc/resolv.conf";
static const char NS_DEV[] = "/dev", NS_DEV_STAGE[] = "/run/.sandboxd-dev";
static const char NS_DEV_DATA[] = "size=64k,nr_inodes=64,mode=0755";
static const char *const NS_DEV_NODES[] = {"null",    "zero", "full", "random",
                                           "urandom", "tty",  "ptmx"};
static const char *const NS_DEV_LINKS[][2] = {
    {"fd", "/proc/self/fd"},
    {"stdin", "/proc/self/fd/0"},
    {"stdout", "/proc/self/fd/1"},
    {"stderr", "/proc/self/fd/2"},
};
static const char NS_INIT_FILE[] = "init";                           /* beside the pins */
static const char NS_HOST_VIEW[] = "mnt-host"; /* a templated sandbox's host view, pinned */

/* Set in the command a relay forked into a pid namespace: it stays in the relay's session. */
static int ns_relayed = 0;

static void ns_loopback_up(void)
{
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        fail(SETUP_FAILED, "loopback socket", NULL, errno);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (ioctl(sock, SIOCGIFFLAGS, &ifr) != 0)
        fail(SETUP_FAILED, "loopback flags", NULL, errno);
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(sock, SIOCSIFFLAGS, &ifr) != 0)
        fail(SETUP_FAILED, "loopback up", NULL, errno);
    close(sock);
}

static int ns_is_dir(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void ns_mount(const char *source, const char *target, const char *type,
                     unsigned long flags, const char *data)
{
    if (mount(source, target, type, flags, data) != 0)
        fail(SETUP_FAILED, "mount", target, errno);
}

/* Every mount a slave (nothing mounted here reaches the host; the host's later mounts arrive),
 * NSROOT detached (this namespace holds no pin); 0, else -1 with errno. */
static int ns_slave_without(const char *nsroot)
{
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0)
        return -1;
    return umount2(nsroot, MNT_DETACH) != 0 && errno != EINVAL ? -1 : 0;
}

/* True when PATH lies in a run-time directory ns_private_run covers (/run, /var/run). */
static int ns_in_run(const char *path)
{
    return strncmp(path, "/run/", 5) == 0 || strncmp(path, "/var/run/", 9) == 0;
}

/* The host's run-time directories and filesystem sockets out of a sandbox's sight
 * (docs/isolation.rst, "What of the host a sandbox sees"): /run becomes a small tmpfs of its
 * own (root's, mode 0755, charged to whoever writes) holding only lock/ (mode 1777, private to
 * the sandbox), and /var/run the same where it is a directory rather than the usual link to
 * /run. Where /etc/resolv.conf resolves into /run (systemd-resolved's stub-resolv.conf,
 * resolvconf's), the file it names is bound at the same path in the new /run, alone (not its
 * directory, which may hold a socket): names resolve as on the host at create. Called before
 * /dev is made (ns_private_dev stages it here) and before the kept directories are bound back
 * (one of them may lie in /run). */
static void ns_private_run(void)
{
    if (!ns_is_dir(NS_RUN))
        return;
    char resolv[PATH_MAX];
    int resolv_fd = -1;
    if (realpath(NS_RESOLV, resolv) != NULL && ns_in_run(resolv))
        resolv_fd = open(resolv, O_PATH | O_CLOEXEC);
    ns_mount("tmpfs", NS_RUN, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NS_RUN_DATA);
    if (mkdir(NS_RUN_LOCK, 01777) != 0 || chmod(NS_RUN_LOCK, 01777) != 0)
        fail(SETUP_FAILED, "mkdir", NS_RUN_LOCK, errno);
    if (ns_is_dir(NS_VAR_RUN))
        ns_mount(NS_RUN, NS_VAR_RUN, NULL, MS_BIND, NULL);
    if (resolv_fd >= 0) {
        for (char *slash = strchr(resolv + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
            *slash = '\0';
            if (mkdir(resolv, 0755) == 0 ? chmod(resolv, 0755) != 0 : errno != EEXIST)
                fail(SETUP_FAILED, "mkdir", resolv, errno);
            *slash = '/';
        }
        int made = open(resolv, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (made < 0)
            fail(SETUP_FAILED, "open", resolv, errno);
        close(made);
        char source[64];
        snprintf(source, sizeof source, "/proc/self/fd/%d", resolv_fd);
        ns_mount(source, resolv, NULL, MS_BIND, NULL);
        close(resolv_fd);
    }
}

/* STAGE/NAME, which must not exist yet, made as a directory (DIR) or an empty file. */
static void ns_dev_entry(const char *name, char *path, size_t size, int dir)
{
    snprintf(path, size, "%s/%s", NS_DEV_STAGE, name);
    if (dir) {
        if (mkdir(path, 0755) != 0)
            fail(SETUP_FAILED, "mkdir", path, errno);
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        fail(SETUP_FAILED, "open", path, errno);
    close(fd);
}

/* A /dev of the sandbox's own, from an allow-list (docs/isolation.rst, "What of the host a
 * sandbox sees"): a small tmpfs (root's, mode 0755) holding the host's null, zero, full,
 * random, urandom, tty and ptmx (bound, where the host has them as character devices), its
 * devpts on pts/, empty shm/ and mqueue/ (mounted after, each the sandbox's own; without an
 * IPC namespace the host's mqueue is bound back), and the links fd, stdin, stdout, stderr into
 * /proc/self/fd. Nothing else of the host's /dev: no socket (/dev/log, a syslog daemon's, made
 * before or after the sandbox), no disk, no kmsg. Built in a staging directory of the private
 * /run (ns_private_run, called first; nothing is done without one) and moved onto /dev whole. */
static void ns_private_dev(int ipc)
{
    struct stat st;
    if (!ns_is_dir(NS_DEV) || !ns_is_dir(NS_RUN))
        return;
    char path[128];
    if (mkdir(NS_DEV_STAGE, 0755) != 0)
        fail(SETUP_FAILED, "mkdir", NS_DEV_STAGE, errno);
    ns_mount("tmpfs", NS_DEV_STAGE, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NS_DEV_DATA);
    for (size_t k = 0; k < sizeof NS_DEV_NODES / sizeof *NS_DEV_NODES; k++) {
        char host[64];
        snprintf(host, sizeof host, "%s/%s", NS_DEV, NS_DEV_NODES[k]);
        if (lstat(host, &st) != 0 || !S_ISCHR(st.st_mode))
            continue;
        ns_dev_entry(NS_DEV_NODES[k], path, sizeof path, 0);
        ns_mount(host, path, NULL, MS_BIND, NULL);
    }
    if (ns_is_dir("/dev/pts")) {
        ns_dev_entry("pts", path, sizeof path, 1);
        ns_mount("/dev/pts", path, NULL, MS_BIND | MS_REC, NULL);
    }
    if (stat("/dev/shm", &st) == 0)
        ns_dev_entry("shm", path, sizeof path, 1);
    if (ns_is_dir("/dev/mqueue")) {
        ns_dev_entry("mqueue", path, sizeof path, 1);
        if (!ipc)
            ns_mount("/dev/mqueue", path, NULL, MS_BIND, NULL);
    }
    for (size_t k = 0; k < sizeof NS_DEV_LINKS / sizeof *NS_DEV_LINKS; k++) {
        snprintf(path, sizeof path, "%s/%s", NS_DEV_STAGE, NS_DEV_LINKS[k][0]);
        if (symlink(NS_DEV_LINKS[k][1], path) != 0)
            fail(SETUP_FAILED, "symlink", path, errno);
    }
    ns_mount(NS_DEV_STAGE, NS_DEV, NULL, MS_MOVE, NULL);
    if (rmdir(NS_DEV_STAGE) != 0)
        fail(SETUP_FAILED, "rmdir", NS_DEV_STAGE, errno);
}

/* The child's mount namespace: slave root, no pins (NSROOT detached, unless NULL: a copy of
 * the template holds none), private /tmp, /var/tmp, /dev/shm, and the workspace at /home/user
 * on a /home of its own. */
static void ns_private_places(const char *nsroot, const char *tmp, const char *workspace,
                              const char *shm_bytes, int keeps, char **keep, int ipc)
{
    if (nsroot == NULL)
        ns_mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL);
    else if (ns_slave_without(nsroot) != 0)
        fail(SETUP_FAILED, "detach", nsroot, errno);
    char tmp_source[64];
    int tmp_fd = open(tmp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (tmp_fd < 0)
        fail(SETUP_FAILED, "open", tmp, errno);
    snprintf(tmp_source, sizeof tmp_source, "/proc/self/fd/%d", tmp_fd);
    char home_source[64];
    int home_fd = open(workspace, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (home_fd < 0)
        fail(SETUP_FAILED, "open", workspace, errno);
    snprintf(home_source, sizeof home_source, "/proc/self/fd/%d", home_fd);
    int keep_fd[NS_KEEP_MAX];
    for (int i = 0; i < keeps; i++) {
        keep_fd[i] = open(keep[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (keep_fd[i] < 0)
            fail(SETUP_FAILED, "keep", keep[i], errno);
    }
    for (size_t p = 0; p < 2; p++)
        if (ns_is_dir(NS_PLACES[p]))
            ns_mount(tmp_source, NS_PLACES[p], NULL, MS_BIND, NULL);
    ns_private_run();
    ns_private_dev(ipc);
    if (ns_is_dir(NS_PLACES[2])) {
        char data[64];
        snprintf(data, sizeof data, "size=%s,mode=1777", shm_bytes);
        ns_mount("tmpfs", NS_PLACES[2], "tmpfs", MS_NOSUID | MS_NODEV, data);
    }
    if (ipc && ns_is_dir("/dev/mqueue"))
        ns_mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    if (ns_is_dir(NS_HOME)) {
        ns_mount("tmpfs", NS_HOME, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=64,mode=0755");
        if (mkdir(NS_HOME_USER, 0755) != 0)
            fail(SETUP_FAILED, "mkdir", NS_HOME_USER, errno);
        ns_mount(home_source, NS_HOME_USER, NULL, MS_BIND, NULL);
    }
    for (int i = 0; i < keeps; i++) {
        char source[64];
        snprintf(source, sizeof source, "/proc/self/fd/%d", keep_fd[i]);
        if (mkdir(keep[i], 0755) != 0 && errno != EEXIST)
            fail(SETUP_FAILED, "mkdir", keep[i], errno);
        ns_mount(source, keep[i], NULL, MS_BIND | MS_REC, NULL);
        close(keep_fd[i]);
    }
    close(home_fd);
    close(tmp_fd);
}

/* The kernel's number of this process's mount namespace; 0 where the kernel numbers none for
 * user space (before 6.10: its loop check then compares a global sequence, always ascending). */
static unsigned long long ns_mount_number(void)
{
    int fd = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    __u64 number = 0;
    if (ioctl(fd, NS_GET_MNTNS_ID, &number) != 0)
        number = 0;
    close(fd);
    return number;
}

/* The kernel pins (bind-mounts) a mount namespace only when its number is above that of the
 * pinner's own (its loop check), and from 6.18 it hands numbers out in per-CPU batches: a
 * namespace made on one CPU can be numbered below an older one made on another, so a daemon
 * whose own mount namespace came from the other CPU (a pod's, a systemd unit's, unshare's)
 * could pin only some. In the holder, after its unshare: where the new mount namespace is not
 * numbered above PINNER, make it anew on each CPU of ALLOWED in turn, then on any other the
 * kernel lets it use (an affinity set by hand may exclude the CPU that made the daemon's), until
 * one is (a namespace made later on the same CPU is numbered higher). Answers the CPU that
 * worked, -1 when the first namespace already was; exits when no CPU works. */
static int ns_number_above(unsigned long long pinner, const cpu_set_t *allowed)
{
    if (pinner == 0 || ns_mount_number() > pinner)
        return -1;
    for (int k = 0; k < 2 * CPU_SETSIZE; k++) { /* those of ALLOWED first, then any other */
        int cpu = k % CPU_SETSIZE;
        if (!CPU_ISSET(cpu, allowed) != (k >= CPU_SETSIZE))
            continue;
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0)
            continue;
        if (unshare(CLONE_NEWNS) != 0)
            fail(SETUP_FAILED, "unshare", "mount (renumbered)", errno);
        if (ns_mount_number() > pinner)
            return cpu;
    }
    fail(SETUP_FAILED, "mount namespace", "numbered above the daemon's on no CPU", ERANGE);
    return -1;
}

/* Bind the sandbox's own passwd and group files (identity_files.py, written beside its pins)
 * over /etc/passwd and /etc/group, where both are there: the sandbox's uid has a name, and
 * nothing changes on the host. Its CA bundle likewise, where it has one and the host has
 * /etc/ssl/certs/ca-certificates.crt (docs/isolation.rst, "Header rules over HTTPS"). Called in the new mount namespace, where NSROOT's mount is gone
 * (a bind from another namespace's mount is refused) but the directory under it is the same. */
static void ns_identity_bind(const char *nsroot, const char *rid)
{
    for (int k = 0; k < 3; k++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s/%s", nsroot, rid, NS_IDENTITY_FILE[k]);
        if (lstat(path, &st) != 0 && errno == ENOENT)
            continue; /* none asked for */
        if (stat(NS_IDENTITY[k], &st) == 0 && S_ISREG(st.st_mode))
            ns_mount(path, NS_IDENTITY[k], NULL, MS_BIND, NULL);
    }
}

#include "sandboxd_exec_root.h" /* a template's root, switched to at pin time */

/* A failure of the parent side: said on stderr, the code returned (the server lives on). */
static int ns_refuse(const char *what, const char *arg, int error)
{
    dprintf(2, "sandboxd-exec: %s%s%s: %s\n", what, arg ? " " : "", arg ? arg : "", strerror(error));
    return SETUP_FAILED;
}

/* The pid namespace's init (pid 1, forked by the holder): mount this namespace's /proc, say
 * so on TOLD (one byte), then hold the namespace for ever, reaping nothing by hand (SIGCHLD
 * ignored: the kernel reaps each orphan it inherits). Only SIGKILL from the host ends it. */
static void ns_init(int told)
{
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        fail(SETUP_FAILED, "mount", "/proc (pid namespace)", errno);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    struct sigaction ignore;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &ignore, NULL); /* SIGKILL, SIGSTOP: refused */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || chdir("/") != 0 || setsid() < 0)
        fail(SETUP_FAILED, "init", "stdio", errno);
    char ok = 1;
    if (write(told, &ok, 1) != 1)
        _exit(SETUP_FAILED);
    for (int fd = 0; fd < 3; fd++)
        dup2(null, fd); /* the server reads the holder's stderr to its end */
    if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0)
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    for (;;)
        pause();
}

/* In the holder, its namespaces made: fork the pid namespace's init and wait until its /proc
 * is mounted. Its pid as the host sees it; exits when it failed (init said why). */
static pid_t ns_start_init(void)
{
    int told[2];
    if (pipe2(told, O_CLOEXEC) != 0)
        fail(SETUP_FAILED, "pipe", "init", errno);
    pid_t init = fork();
    if (init < 0)
        fail(SETUP_FAILED, "fork", "init", errno);
    if (init == 0) {
        close(told[0]);
        ns_init(told[1]);
    }
    close(told[1]);
    char ok = 0;
    while (read(told[0], &ok, 1) < 0 && errno == EINTR)
        ;
    close(told[0]);
    if (ok != 1)
        _exit(SETUP_FAILED);
    return init;
}

/* Beside the pins: init's pid (the host's number), for the daemon to kill it at the end. */
static int ns_write_init(const char *nsroot, const char *rid, pid_t init)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", nsroot, rid, NS_INIT_FILE);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0400);
    if (fd < 0)
        return ns_refuse("init file", path, errno);
    int ok = dprintf(fd, "%d\n", (int)init) > 0;
    int error = errno;
    if (close(fd) != 0 || !ok)
        return ns_refuse("init file", path, ok ? errno : error);
    return 0;
}

/* The server's template mount namespace for NSROOT (made at the first request naming it, in
 * the server itself, which then goes back to the host's): its descriptor, or -1 with errno. */
static int ns_template(const char *nsroot)
{
    static int template = -1;
    static char made_for[4096];
    if (template >= 0 && strcmp(made_for, nsroot) == 0)
        return template;
    if (template >= 0)
        close(template);
    template = -1;
    if (strlen(nsroot) >= sizeof made_for) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int host = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (host < 0)
        return -1;
    int made = -1, error = 0;
    if (unshare(CLONE_NEWNS) != 0) {
        error = errno;
    } else {
        if (ns_slave_without(nsroot) == 0)
            made = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
        error = errno;
        if (setns(host, CLONE_NEWNS) != 0) /* pins made here would be out of the host's sight */
            fail(SETUP_FAILED, "setns", "back to the host's mount namespace", errno);
    }
    close(host);
    if (made < 0) {
        errno = error;
        return -1;
    }
    strcpy(made_for, nsroot);
    return template = made;
}

/* A new mount namespace copies the server's template when USE_TEMPLATE (else the caller's,
 * then trimmed of NSROOT). */
static int make_namespaces(int argc, char **argv, int use_template)
{
    if (argc < 8 || argc - 8 > NS_KEEP_MAX)
        return ns_refuse("bad", "namespaces arguments", EINVAL);
    const char *nsroot = argv[2], *rid = argv[3], *kinds = argv[4];
    int ipc = strchr(kinds, 'i') != NULL, mnt = strchr(kinds, 'm') != NULL;
    int net = strchr(kinds, 'n') != NULL, pid = strchr(kinds, 'p') != NULL;
    if (pid && !mnt) /* its /proc goes in the sandbox's mount namespace */
        return ns_refuse("bad", "namespaces: a pid namespace needs a mount namespace", EINVAL);
    int flags = (ipc ? CLONE_NEWIPC : 0) | (mnt ? CLONE_NEWNS : 0) | (net ? CLONE_NEWNET : 0) |
                (pid ? CLONE_NEWPID : 0);
    int template = -1;
    if (mnt && use_template && (template = ns_template(nsroot)) < 0)
        return ns_refuse("template", nsroot, errno);
    /* Where the holders may run (the first call's affinity: later ones may be pinned below). */
    static cpu_set_t allowed;
    static int allowed_known = 0;
    if (!allowed_known && sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return ns_refuse("sched_getaffinity", NULL, errno);
    allowed_known = 1;
    unsigned long long pinner = mnt ? ns_mount_number() : 0;
    int ready[2], done[2];
    if (pipe2(ready, O_CLOEXEC) != 0)
        return ns_refuse("pipe", NULL, errno);
    if (pipe2(done, O_CLOEXEC) != 0) {
        close(ready[0]);
        close(ready[1]);
        return ns_refuse("pipe", NULL, errno);
    }
    pid_t child = fork();
    if (child < 0) {
        int error = errno;
        close(ready[0]);
        close(ready[1]);
        close(done[0]);
        close(done[1]);
        return ns_refuse("fork", NULL, error);
    }
    if (child == 0) {
        close(ready[0]);
        close(done[1]);
        if (template >= 0 && setns(template, CLONE_NEWNS) != 0)
            fail(SETUP_FAILED, "setns", "template", errno);
        if (unshare(flags) != 0)
            fail(SETUP_FAILED, "unshare", kinds, errno);
        int cpu = mnt ? ns_number_above(pinner, &allowed) : -1;
        int host_view = -1;
        if (mnt) {
            ns_private_places(template >= 0 ? NULL : nsroot, argv[5], argv[6], argv[7], argc - 8,
                              argv + 8, ipc);
            ns_identity_bind(nsroot, rid);
            host_view = ns_private_root(nsroot, rid, argv[5], argv[6]);
        }
        if (net)
            ns_loopback_up();
        int said[3] = {cpu, pid ? (int)ns_start_init() : 0, host_view};
        char ignored;
        if (write(ready[1], said, sizeof said) != sizeof said)
            _exit(SETUP_FAILED);
        /* Held until the parent has pinned the namespaces (or died). */
        while (read(done[0], &ignored, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    close(ready[1]);
    close(done[0]);
    int said[3];
    ssize_t got;
    while ((got = read(ready[0], said, sizeof said)) < 0 && errno == EINTR)
        ;
    close(ready[0]);
    int cpu = said[0];
    if (got != sizeof said) {
        close(done[1]);
        waitpid(child, NULL, 0);
        return SETUP_FAILED; /* the child said why */
    }
    if (cpu >= 0) { /* the next holders start where numbers are high enough */
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        sched_setaffinity(0, sizeof one, &one);
    }
    int refused = pid ? ns_write_init(nsroot, rid, (pid_t)said[1]) : 0;
    static const char *const names[] = {"ipc", "mnt", "net", "pid"};
    static const char *const sources[] = {"ipc", "mnt", "net", "pid_for_children"};
    const int wanted[] = {ipc, mnt, net, pid};
    for (int k = 0; k < 4 && refused == 0; k++) {
        if (!wanted[k])
            continue;
        char source[64], pin[4096];
        snprintf(source, sizeof source, "/proc/%d/ns/%s", (int)child, sources[k]);
        snprintf(pin, sizeof pin, "%s/%s/%s", nsroot, rid, names[k]);
        int fd = open(pin, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0400);
        if (fd < 0 || close(fd) != 0 || mount(source, pin, NULL, MS_BIND, NULL) != 0) {
            refused = ns_refuse("pin", pin, errno);
            break;
        }
    }
    if (refused == 0 && said[2] >= 0) { /* a template's root: the host's view pinned too */
        char source[64], pin[4096];
        snprintf(source, sizeof source, "/proc/%d/fd/%d", (int)child, said[2]);
        snprintf(pin, sizeof pin, "%s/%s/%s", nsroot, rid, NS_HOST_VIEW);
        int fd = open(pin, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0400);
        if (fd < 0 || close(fd) != 0 || mount(source, pin, NULL, MS_BIND, NULL) != 0)
            refused = ns_refuse("pin", pin, errno);
    }
    close(done[1]);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (refused == 0 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
        refused = ns_refuse("namespace holder", NULL, ECHILD);
    if (refused != 0 && pid && said[1] > 0)
        kill((pid_t)said[1], SIGKILL); /* no sandbox to end it later: its namespace goes now */
    return refused;
}

/* The CLONE_NEW* type of a pin, from its name (ipc, mnt, net); 0 (any) for another name.
 * setns is given the type, not 0: a service manager's namespace filter (systemd's
 * RestrictNamespaces=) allows setns only for the types it lists, and refuses 0. */
static int namespace_type(const char *path)
{
    const char *name = strrchr(path, '/');
    name = name == NULL ? path : name + 1;
    if (strcmp(name, "ipc") == 0)
        return CLONE_NEWIPC;
    if (strcmp(name, "mnt") == 0 || strcmp(name, NS_HOST_VIEW) == 0)
        return CLONE_NEWNS;
    if (strcmp(name, "net") == 0)
        return CLONE_NEWNET;
    if (strcmp(name, "pid") == 0)
        return CLONE_NEWPID;
    return 0;
}

/* The relay joins the sandbox's cgroups once the command is forked (ARGV: HELPER [--OPTION..]
 * sandbox UID GID CWD N JOIN_1 .. JOIN_N CMD ..): it is the sandbox's to pay for (memory, a
 * pid), and ends with it when its cgroup is killed. After the fork, not before: a sandbox at
 * its pids.max still starts a command, as without the relay (a move into a cgroup is not held
 * to its pids.max; the command's own join then fails or not as before). Best effort: a join
 * the relay cannot make, the command's own step refuses. */
static void relay_join_cgroups(int argc, char **argv)
{
    int at = 1;
    while (at < argc && strncmp(argv[at], "--", 2) == 0)
        at++;
    if (at + 5 >= argc || strcmp(argv[at], "sandbox") != 0)
        return;
    char *end = NULL;
    long joins = strtol(argv[at + 4], &end, 10);
    if (end == argv[at + 4] || *end != '\0' || joins < 0 || joins > argc - at - 6)
        return; /* the sandbox step refuses it */
    for (long k = 0; k < joins; k++) {
        int fd = open_for_writing(argv[at + 5 + k]);
        if (fd >= 0 && write(fd, "0\n", 2) != 2)
            dprintf(2, "sandboxd-exec: relay: cannot join cgroup %s\n", argv[at + 5 + k]);
        if (fd >= 0)
            close(fd);
    }
}

/* Before setns (ARGV as relay_join_cgroups takes it): each JOIN file opened now and named
 * "fd:N" from here on, so that a command whose mount namespace has a template's root, where
 * the host's cgroup files are out of sight, joins them all the same. A file that cannot be
 * opened keeps its path: the join then fails as it would have. */
static void pre_open_joins(int argc, char **argv)
{
    int at = 1;
    while (at < argc && strncmp(argv[at], "--", 2) == 0)
        at++;
    if (at + 5 >= argc || strcmp(argv[at], "sandbox") != 0)
        return;
    char *end = NULL;
    long joins = strtol(argv[at + 4], &end, 10);
    if (end == argv[at + 4] || *end != '\0' || joins < 0 || joins > argc - at - 6)
        return;
    for (long k = 0; k < joins; k++) {
        int fd = open(argv[at + 5 + k], O_WRONLY | O_CLOEXEC);
        char *named = NULL;
        if (fd >= 0 && asprintf(&named, "fd:%d", fd) > 0)
            argv[at + 5 + k] = named;
    }
}

/* A terminal's relay (--ctty): the command must lead a session of its own inside the
 * namespace, or a shell there finds its terminal's first process group outside it (dash then
 * exits 2 at its end, unable to give the terminal back). So the relay gives the terminal up
 * (TIOCNOTTY; the SIGHUP it sends the relay's own group is ignored for the moment), the
 * command makes it its controlling terminal (new_session in the "sandbox" step), ... */
static void relay_release_terminal(void)
{
    void (*hup)(int) = signal(SIGHUP, SIG_IGN);
    if (ioctl(0, TIOCNOTTY) != 0)
        fail(SETUP_FAILED, "TIOCNOTTY", "fd 0", errno);
    signal(SIGHUP, hup);
}

/* ... and, the command being in another process group than the relay's (which the daemon
 * signals), every signal the relay is sent goes on to the command's group; a SIGKILL, which
 * cannot, reaches the command as its parent-death signal (set after its privilege drop).
 * Returns the command's wait status. The command is looked for before each wait: it may have
 * ended before the first (its SIGCHLD then pending already, or taken). */
static int relay_signals(pid_t command, const sigset_t *all)
{
    for (;;) {
        int status = 0;
        pid_t done = waitpid(command, &status, WNOHANG);
        if (done == command)
            return status;
        if (done < 0 && errno != EINTR)
            fail(SETUP_FAILED, "waitpid", "the command", errno);
        siginfo_t info;
        int sig = sigwaitinfo(all, &info);
        if (sig > 0 && sig != SIGCHLD) /* else EINTR, or the command ended: looked for above */
            kill(-command, sig);
    }
}

/* After setns into a pid namespace (which moves only the caller's children): lead a new
 * session (the daemon's killpg of this pid reaches the whole group), fork the command into the
 * namespace, and in this process, every signal blocked (each one the daemon sends the group
 * reaches the command too), wait for it and end as it did. A signal that came before the fork
 * (sent to this process alone, or to a group the command was not in yet) is passed on to the
 * command: it would be lost otherwise. Before setsid, signals act on this process as they
 * would on the helper (a TERM then ends it, and no command starts). Returns in the command. */
static void relay_pid_namespace(int argc, char **argv)
{
    int ctty = 0; /* --ctty: the terminal goes to the command's own session (relay_terminal) */
    for (int at = 1; at < argc && strncmp(argv[at], "--", 2) == 0; at++)
        ctty |= strcmp(argv[at], "--ctty") == 0;
    new_session(ctty);
    if (ctty)
        relay_release_terminal();
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    pid_t command = fork();
    if (command < 0)
        fail(SETUP_FAILED, "fork", "into the pid namespace", errno);
    if (command == 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        ns_relayed = 1;
        return;
    }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    relay_join_cgroups(argc, argv);
    sigset_t early;
    sigemptyset(&early);
    sigpending(&early);
    struct timespec now = {0, 0};
    for (int sig = 1; sig < NSIG; sig++) {
        /* SIGCHLD is the command's own end (it may be over already), not one to pass on */
        if (sig == SIGCHLD || sigismember(&early, sig) != 1)
            continue;
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        sigtimedwait(&one, NULL, &now); /* taken: the command gets it instead */
        kill(command, sig);
    }
    int status = ctty ? relay_signals(command, &all) : 0;
    while (!ctty && waitpid(command, &status, 0) < 0)
        if (errno != EINTR)
            fail(SETUP_FAILED, "waitpid", "the command", errno);
    if (WIFEXITED(status))
        _exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none); /* the command dumped its core already, if any */
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    kill(getpid(), sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    _exit(128 + sig);
}

/* "enter N NS.. HELPER MODE ...": setns into each, then the arguments from HELPER on. */
static char **enter_namespaces(int *argc, char **argv)
{
    char *end = NULL;
    long count = *argc > 2 ? strtol(argv[2], &end, 10) : -1;
    if (end == argv[2] || (end != NULL && *end != '\0') || count < 0 || count > *argc - 4)
        fail(SETUP_FAILED, "bad", "namespace count", EINVAL);
    pre_open_joins(*argc - 3 - (int)count, argv + 3 + count);
    int pid = 0;
    for (long i = 0; i < count; i++) {
        const char *path = argv[3 + i];
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            fail(SETUP_FAILED, "open namespace", path, errno);
        if (setns(fd, namespace_type(path)) != 0)
            fail(SETUP_FAILED, "setns", path, errno);
        pid |= namespace_type(path) == CLONE_NEWPID;
        close(fd);
    }
    if (pid && !zygote_mode)
        relay_pid_namespace(*argc - 3 - (int)count, argv + 3 + count);
    *argc -= 3 + (int)count;
    return argv + 3 + count;
}

static int serve_namespaces(void)
{
    static char line[65536];
    for (;;) {
        size_t used = 0;
        ssize_t got = 0;
        while (used < sizeof line - 1 && (got = read(0, line + used, 1)) == 1 && line[used] != '\n')
            used++;
        if (got <= 0)
            return 0;
        line[used] = '\0';
        char *args[9 + NS_KEEP_MAX] = {"sandboxd-exec", "namespaces"};
        int count = 2;
        for (char *tok = strtok(line, "\t"); tok != NULL && count < 8 + NS_KEEP_MAX;
             tok = strtok(NULL, "\t"))
            args[count++] = tok;
        args[count] = NULL;
        /* This request's messages (ours and the holder's) go to a pipe of its own. */
        int err[2];
        if (pipe2(err, O_CLOEXEC) != 0)
            return SETUP_FAILED;
        int saved = fcntl(2, F_DUPFD_CLOEXEC, 3);
        if (saved < 0 || dup2(err[1], 2) < 0)
            return SETUP_FAILED;
        close(err[1]);
        int code = make_namespaces(count, args, 1);
        dup2(saved, 2);
        close(saved);
        char message[2048];
        size_t length = 0;
        ssize_t part;
        while ((part = read(err[0], message + length, sizeof message - 1 - length)) > 0)
            length += (size_t)part;
        close(err[0]);
        for (size_t i = 0; i < length; i++)
            if (message[i] == '\n' || message[i] == '\t')
                message[i] = ' ';
        char answer[2100];
        int size = snprintf(answer, sizeof answer, "%d\t%.*s\n", code, (int)length, message);
        if (write(1, answer, (size_t)size) != size)
            return SETUP_FAILED;
    }
}
