/*
 * sandboxd-exec's --no-ptrace (included by sandboxd_exec.c; see sandboxd/isolation/exec/privdrop.py).
 *
 *   sandboxd-exec --no-ptrace sandbox UID GID CWD N JOIN.. /ABSOLUTE/PROGRAM [ARG..]
 *
 * For a process the daemon starts as a sandbox's uid for its own work (the archive's rsync end):
 * the sandbox's own processes run as the same uid, and the kernel lets a process ptrace (or read
 * and write the memory of) any process of its uid that is "dumpable". Every exec makes a process
 * dumpable again unless it runs a program its uid cannot read; so the program is copied, as the
 * sandbox's uid, into a memfd whose mode is 0111 (execute only), and the exec is of that copy:
 * the kernel then keeps the process non-dumpable, and no process of the sandbox can attach to it
 * or open its /proc/PID/mem. (The helper itself is non-dumpable from the privilege drop on: the
 * kernel clears the flag when the uid changes.) PROGRAM must be an absolute path (no PATH
 * search) to a binary, not a script (the memfd is closed at the exec, so an interpreter could not
 * reopen it). Exit codes as the exec's: 127 when PROGRAM cannot be opened, 126 otherwise.
 */
#include <sys/mman.h>

#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif

/* The memfd copy of ``path``, mode 0111; -1 with errno set. It is named after the program
 * (its comm, what ps shows, is then "memfd:NAME" on the kernels that name it after the file). */
static int noptrace_copy(const char *path)
{
    int source = open(path, O_RDONLY | O_CLOEXEC);
    if (source < 0)
        return -1;
    char name[64];
    snprintf(name, sizeof name, "%s", strrchr(path, '/') + 1);
    int copy = memfd_create(name, MFD_CLOEXEC | MFD_EXEC);
    if (copy < 0 && errno == EINVAL) /* a kernel before 6.3: executable is the default */
        copy = memfd_create(name, MFD_CLOEXEC);
    int error = errno;
    static char buf[1 << 16];
    ssize_t got = copy < 0 ? -1 : 0;
    while (copy >= 0 && (got = read(source, buf, sizeof buf)) > 0) {
        for (ssize_t done = 0, put; done < got; done += put)
            if ((put = write(copy, buf + done, (size_t)(got - done))) <= 0) {
                got = -1;
                break;
            }
        if (got < 0)
            break;
    }
    if (copy >= 0 && got == 0 && fchmod(copy, 0111) == 0) {
        close(source);
        return copy;
    }
    error = copy < 0 ? error : (errno ? errno : EIO);
    close(source);
    if (copy >= 0)
        close(copy);
    errno = error;
    return -1;
}

/* Exec ``argv`` from its execute-only copy; returns only on failure (errno set). */
static void noptrace_exec(char **argv, char **env)
{
    if (argv[0][0] != '/') {
        errno = ENOENT;
        return;
    }
    int copy = noptrace_copy(argv[0]);
    if (copy < 0)
        return;
    fexecve(copy, argv, env);
    int error = errno;
    close(copy);
    errno = error;
}
