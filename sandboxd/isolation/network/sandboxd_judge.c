/*
 * sandboxd-judge: the egress judge. Each judged connection's first payload is queued to it by
 * the kernel (NFQUEUE); it reads the name the payload asks for (sandboxd_judge_peek.h), has the
 * daemon resolve that name, and judges the connection by the sandbox's policy
 * (sandboxd_judge_policy.h). Its verdict is a packet mark the ruleset saves on the connection:
 * allowed, every later packet stays in the kernel; refused, the ruleset resets it.
 *
 *   sandboxd-judge QUEUE JUDGE_MARK ALLOW_MARK REFUSE_MARK   judge, for ever (as root)
 *   sandboxd-judge peek                                        the name of stdin's bytes
 *   sandboxd-judge confine-check [none]                        its confinement, tried
 *
 * The daemon talks to it over stdin and stdout, one line each, space-separated:
 *   in:  policy IFINDEX WINS HAS_ALLOW [+NAME|-NAME|+ADDRESS/PREFIX|-ADDRESS/PREFIX ..]
 *        forget IFINDEX
 *        addresses NAME TTL [ADDRESS ..]        (the answer to a "resolve")
 *   out: ready                                  (bound to its queue)
 *        resolve NAME
 *        refused IFINDEX REASON ADDRESS [NAME]
 * IFINDEX is the sandbox's veth on the host. A connection's payload may span packets (a
 * ClientHello larger than one segment): they are held until the name is whole. A packet that
 * cannot be judged within FLOW_TIMEOUT seconds, from a sandbox without a policy here, or past
 * the bounds below is refused. The judge exits when stdin closes; while it is gone the kernel
 * drops what it would have queued (the ruleset does not bypass the queue): egress fails closed.
 * Once bound it runs as nobody with CAP_NET_ADMIN alone and a seccomp filter
 * (sandboxd_judge_confine.h).
 */
#define _GNU_SOURCE
#include <arpa/inet.h> /* (before the kernel's headers, which define struct in_addr too) */
#include <netinet/in.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sandboxd_judge_peek.h"
#include "sandboxd_judge_policy.h"
#include "sandboxd_judge_io.h"
#include "sandboxd_judge_flows.h"
#include "sandboxd_judge_queue.h"
#include "sandboxd_judge_commands.h"
#include "sandboxd_judge_confine.h"

static int peek_main(void) {
    static unsigned char data[PEEK_MAX + 6];
    size_t n = fread(data, 1, sizeof data, stdin);
    char name[MAX_NAME + 1];
    int found = peek_name(data, n, name);
    if (found == PEEK_NAME)
        printf("name %s\n", name);
    else
        printf(found == PEEK_MORE ? "more\n" : "none\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "peek") == 0)
        return peek_main();
    if (argc >= 2 && strcmp(argv[1], "confine-check") == 0)
        return confine_check(!(argc == 3 && strcmp(argv[2], "none") == 0));
    if (argc != 5) {
        fprintf(stderr, "usage: sandboxd-judge QUEUE JUDGE_MARK ALLOW_MARK REFUSE_MARK"
                        " | sandboxd-judge peek\n");
        return 2;
    }
    queue = (unsigned short)strtoul(argv[1], NULL, 0);
    judge_mark = (unsigned)strtoul(argv[2], NULL, 0);
    allow_mark = (unsigned)strtoul(argv[3], NULL, 0);
    refuse_mark = (unsigned)strtoul(argv[4], NULL, 0);
    if (bind_queue() != 0)
        return 1;
    fcntl(STDOUT_FILENO, F_SETFL, fcntl(STDOUT_FILENO, F_GETFL) | O_NONBLOCK);
    if (confine(1) != 0)
        return 1;
    say("ready\n");
    struct pollfd fds[3] = {{.fd = nl, .events = POLLIN}, {.fd = STDIN_FILENO, .events = POLLIN},
                            {.fd = STDOUT_FILENO, .events = 0}};
    for (;;) {
        fds[2].events = out_len ? POLLOUT : 0;
        if (poll(fds, 3, 1000) < 0 && errno != EINTR) {
            perror("sandboxd-judge: poll");
            return 1;
        }
        if (fds[1].revents & (POLLIN | POLLHUP)) { /* (first: a policy before its packets) */
            int r = read_commands();
            if (r != 0)
                return r < 0 ? 1 : 0;
        }
        if (fds[0].revents & POLLIN && read_queue() != 0)
            return 1;
        flush_out();
        expire(now());
    }
}
