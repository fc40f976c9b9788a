/*
 * sandboxd-exec's root switch for a sandbox made from a template (included by
 * sandboxd_exec_ns.h; see sandboxd/isolation/namespaces/root_view.py).
 *
 * Where NSROOT/RID holds "root" (written by the daemon, root's alone), the holder of a new
 * mount namespace, once its private places are made (ns_private_places), switches its root:
 *
 *   line 1  the overlay's mount data (lowerdir=TEMPLATE,upperdir=UPPER,workdir=WORK)
 *   line 2  MERGED, the directory it is mounted on (nosuid,nodev)
 *   line 3+ host directories bound back at their own path inside (the sandbox's own tree:
 *           its commands' working directory, HOME and TMPDIR name host paths there)
 *
 * pivot_root moves the namespace's root onto the overlay; the old root is detached once the
 * new one holds what a sandbox needs: a /proc (the host pid namespace's; a pid namespace's
 * init mounts its own over it), /dev (the allow-list ns_private_dev made, with its pts, shm
 * and mqueue), /tmp and /var/tmp (the sandbox's tmp), /run a fresh tmpfs holding lock/,
 * /home a small tmpfs holding user (the workspace), /etc/passwd and /etc/group (the
 * sandbox's, beside the pins), /etc/hosts ("hosts" beside the pins), /etc/resolv.conf
 * (the host's file, as a sandbox without a template sees it), and the sandbox's CA bundle
 * ("ca-certificates.crt" beside the pins, made from the template's own: identity_files.py)
 * over /etc/ssl/certs/ca-certificates.crt where the template has that as a file of its own
 * (a link there is left alone: never replaced nor followed). Every source is opened before
 * the pivot and named by descriptor after it; every target is made inside the new root (a
 * link the template holds there is replaced, never followed out: after the pivot "/" is the
 * template's). Nothing of the host's tree is left in the namespace.
 */

#include <sys/syscall.h>

static const char NS_ROOT_FILE[] = "root", NS_HOSTS_FILE[] = "hosts";
static const char NS_OLD_ROOT[] = "/.sandboxd-host";
#define NS_ROOT_BINDS 4

/* PATH's directories made in the current root (mode 0755, root's), PATH itself included. */
static void ns_mkdirs(const char *path)
{
    char made[PATH_MAX];
    snprintf(made, sizeof made, "%s", path);
    for (char *slash = strchr(made + 1, '/');; slash = strchr(slash + 1, '/')) {
        if (slash != NULL)
            *slash = '\0';
        if (mkdir(made, 0755) != 0 && errno != EEXIST)
            fail(SETUP_FAILED, "mkdir", made, errno);
        if (!ns_is_dir(made))
            fail(SETUP_FAILED, "not a directory", made, ENOTDIR);
        if (slash == NULL)
            return;
        *slash = '/';
    }
}

/* PATH a regular file of the current root (a link or other entry there is replaced). */
static void ns_plain_file(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode) && unlink(path) != 0)
        fail(SETUP_FAILED, "unlink", path, errno);
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        fail(SETUP_FAILED, "open", path, errno);
    close(fd);
}

/* An O_PATH descriptor of the host's SOURCE (before the pivot). */
static int ns_source(const char *source)
{
    int fd = open(source, O_PATH | O_CLOEXEC);
    if (fd < 0)
        fail(SETUP_FAILED, "open", source, errno);
    return fd;
}

/* Bind descriptor FD onto TARGET of the new root (made as a directory or a file, DIR), with
 * FLAGS beyond MS_BIND; nosuid,nodev on the top mount when PLAIN. */
static void ns_bind_fd(int fd, const char *target, int dir, unsigned long flags, int plain)
{
    char source[64];
    snprintf(source, sizeof source, "/proc/self/fd/%d", fd);
    if (dir) {
        ns_mkdirs(target);
    } else {
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%s", target);
        *strrchr(parent, '/') = '\0';
        ns_mkdirs(parent);
        ns_plain_file(target);
    }
    ns_mount(source, target, NULL, MS_BIND | flags, NULL);
    if (plain)
        ns_mount(NULL, target, NULL, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV, NULL);
    close(fd);
}

/* The root switch (see the top of this file); nothing when NSROOT/RID holds no "root" (-1).
 * The switch is made in a copy of the namespace as it is (the host's view, its places made
 * private): a descriptor of that one is returned, for the parent to pin as "mnt-host", where
 * the daemon's own work as the sandbox (the archive's rsync end) runs, needing nothing of the
 * template. */
static int ns_private_root(const char *nsroot, const char *rid, const char *tmp,
                           const char *workspace)
{
    char path[PATH_MAX], spec[4 * PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/%s/%s", nsroot, rid, NS_ROOT_FILE);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return -1;
    if (fd < 0)
        fail(SETUP_FAILED, "open", path, errno);
    ssize_t got = read(fd, spec, sizeof spec - 1);
    close(fd);
    if (got <= 0)
        fail(SETUP_FAILED, "read", path, got < 0 ? errno : EINVAL);
    spec[got] = '\0';
    char *lines[2 + NS_ROOT_BINDS], *save = NULL;
    int count = 0;
    for (char *line = strtok_r(spec, "\n", &save); line != NULL && count < 2 + NS_ROOT_BINDS;
         line = strtok_r(NULL, "\n", &save))
        lines[count++] = line;
    if (count < 2 || lines[1][0] != '/')
        fail(SETUP_FAILED, "bad", path, EINVAL);
    const char *merged = lines[1];
    /* A copy to switch (a bind's source must be of the namespace it is made in). */
    int host_view = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (host_view < 0 || unshare(CLONE_NEWNS) != 0)
        fail(SETUP_FAILED, "unshare", "mount (the template's)", errno);
    /* The sources, from the host's tree (this namespace's, its places made private). */
    int ws = ns_source(workspace), own_tmp = ns_source(tmp), dev = ns_source(NS_DEV);
    int identity[2], hosts, resolv = -1, binds[NS_ROOT_BINDS];
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s/%s", nsroot, rid, NS_IDENTITY_FILE[k]);
        identity[k] = ns_source(path);
    }
    snprintf(path, sizeof path, "%s/%s/%s", nsroot, rid, NS_HOSTS_FILE);
    hosts = ns_source(path);
    struct stat st;
    int trust = -1;
    snprintf(path, sizeof path, "%s/%s/%s", nsroot, rid, NS_IDENTITY_FILE[2]);
    if (lstat(path, &st) == 0)
        trust = ns_source(path);
    if (stat(NS_RESOLV, &st) == 0 && S_ISREG(st.st_mode))
        resolv = ns_source(NS_RESOLV);
    for (int k = 2; k < count; k++)
        binds[k - 2] = ns_source(lines[k]);
    ns_mount("overlay", merged, "overlay", MS_NOSUID | MS_NODEV, lines[0]);
    snprintf(path, sizeof path, "%s%s", merged, NS_OLD_ROOT);
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        fail(SETUP_FAILED, "mkdir", path, errno);
    if (!ns_is_dir(path)) /* the template's own entry there: never followed */
        fail(SETUP_FAILED, "not a directory", path, ENOTDIR);
    if (syscall(SYS_pivot_root, merged, path) != 0)
        fail(SETUP_FAILED, "pivot_root", merged, errno);
    if (chdir("/") != 0)
        fail(SETUP_FAILED, "chdir", "/", errno);
    ns_mkdirs("/proc");
    ns_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    ns_bind_fd(dev, NS_DEV, 1, MS_REC, 0);
    if (ns_is_dir("/var/tmp"))
        ns_bind_fd(dup(own_tmp), "/var/tmp", 1, 0, 1);
    ns_bind_fd(own_tmp, "/tmp", 1, 0, 1);
    ns_mkdirs(NS_RUN);
    ns_mount("tmpfs", NS_RUN, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NS_RUN_DATA);
    if (mkdir(NS_RUN_LOCK, 01777) != 0 || chmod(NS_RUN_LOCK, 01777) != 0)
        fail(SETUP_FAILED, "mkdir", NS_RUN_LOCK, errno);
    ns_mkdirs(NS_HOME);
    ns_mount("tmpfs", NS_HOME, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=64,mode=0755");
    ns_bind_fd(ws, NS_HOME_USER, 1, 0, 1);
    for (int k = 0; k < 2; k++)
        ns_bind_fd(identity[k], NS_IDENTITY[k], 0, 0, 1);
    ns_bind_fd(hosts, "/etc/hosts", 0, 0, 1);
    if (resolv >= 0)
        ns_bind_fd(resolv, NS_RESOLV, 0, 0, 1);
    if (trust >= 0 && lstat(NS_IDENTITY[2], &st) == 0 && S_ISREG(st.st_mode))
        ns_bind_fd(trust, NS_IDENTITY[2], 0, 0, 1);
    else if (trust >= 0)
        close(trust);
    for (int k = 2; k < count; k++)
        ns_bind_fd(binds[k - 2], lines[k], 1, 0, 1);
    if (umount2(NS_OLD_ROOT, MNT_DETACH) != 0)
        fail(SETUP_FAILED, "umount", NS_OLD_ROOT, errno);
    if (rmdir(NS_OLD_ROOT) != 0)
        fail(SETUP_FAILED, "rmdir", NS_OLD_ROOT, errno);
    return host_view;
}
