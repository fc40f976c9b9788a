/*
 * The judge's two channels: the kernel's queue (netlink: bind, verdicts) and the lines it
 * writes to the daemon (a bounded buffer on a non-blocking stdout: a daemon that stops reading
 * loses refusal reports, never the judge its queue). Included by sandboxd_judge.c only.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { OUT_MAX = 1 << 16, QUEUE_MAXLEN = 4096, COPY_RANGE = 0xffff };

static int nl = -1;
static unsigned short queue;
static unsigned judge_mark, allow_mark, refuse_mark;
static char out[OUT_MAX];
static size_t out_len;
static unsigned long lost_lines;

/* Queue a line for the daemon ("resolve" lines never exceed a name's length, so a full
 * buffer drops reports of refusals first: it holds OUT_MAX / 2 of them at most). */
static void say(const char *format, ...) {
    char line[MAX_NAME + 128];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(line, sizeof line, format, args);
    va_end(args);
    if (n < 0 || (size_t)n >= sizeof line)
        return;
    size_t room = strncmp(line, "refused", 7) == 0 ? OUT_MAX / 2 : OUT_MAX;
    if (out_len + (size_t)n > room) {
        lost_lines++;
        return;
    }
    memcpy(out + out_len, line, (size_t)n);
    out_len += (size_t)n;
}

static void flush_out(void) {
    while (out_len) {
        ssize_t n = write(STDOUT_FILENO, out, out_len);
        if (n <= 0)
            return; /* (EAGAIN: poll says when it may go on; EPIPE: stdin's end says so) */
        memmove(out, out + n, out_len - (size_t)n);
        out_len -= (size_t)n;
    }
}

static void put_attr(char *buf, size_t *len, unsigned short type, const void *data, size_t n) {
    struct nlattr *a = (struct nlattr *)(buf + *len);
    a->nla_len = (unsigned short)(NLA_HDRLEN + n);
    a->nla_type = type;
    memcpy(buf + *len + NLA_HDRLEN, data, n);
    *len += NLA_ALIGN(NLA_HDRLEN + n);
}

static int send_msg(int kind, const char *attrs, size_t attrs_len, unsigned short flags) {
    char buf[256];
    struct nlmsghdr *h = (struct nlmsghdr *)buf;
    struct nfgenmsg *g = (struct nfgenmsg *)(buf + NLMSG_HDRLEN);
    size_t len = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof *g);
    memset(buf, 0, len);
    memcpy(buf + len, attrs, attrs_len);
    len += attrs_len;
    h->nlmsg_len = (unsigned)len;
    h->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | kind;
    h->nlmsg_flags = NLM_F_REQUEST | flags;
    g->nfgen_family = AF_UNSPEC;
    g->res_id = htons(queue);
    if (send(nl, buf, len, 0) < 0) {
        perror("sandboxd-judge: netlink send");
        return -1;
    }
    return 0;
}

/* The packet id's verdict; NF_REPEAT with mark: the hook runs again with the new mark. */
static int verdict(unsigned id, unsigned kind, int set_mark, unsigned mark) {
    char attrs[64];
    size_t len = 0;
    struct nfqnl_msg_verdict_hdr v = {.verdict = htonl(kind), .id = htonl(id)};
    put_attr(attrs, &len, NFQA_VERDICT_HDR, &v, sizeof v);
    if (set_mark) {
        unsigned m = htonl(mark);
        put_attr(attrs, &len, NFQA_MARK, &m, sizeof m);
    }
    return send_msg(NFQNL_MSG_VERDICT, attrs, len, 0);
}

/* The kernel's answer to the last request sent with NLM_F_ACK: 0, or -1 saying why not. */
static int acked(const char *what) {
    char buf[512];
    ssize_t got = recv(nl, buf, sizeof buf, 0);
    struct nlmsghdr *h = (struct nlmsghdr *)buf;
    if (got < (ssize_t)NLMSG_HDRLEN || h->nlmsg_type != NLMSG_ERROR) {
        fprintf(stderr, "sandboxd-judge: %s: no answer from the kernel\n", what);
        return -1;
    }
    int error = ((struct nlmsgerr *)NLMSG_DATA(h))->error;
    if (error != 0) {
        fprintf(stderr, "sandboxd-judge: %s queue %u: %s\n", what, queue, strerror(-error));
        return -1;
    }
    return 0;
}

static int bind_queue(void) {
    nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    struct sockaddr_nl here = {.nl_family = AF_NETLINK};
    if (nl < 0 || bind(nl, (struct sockaddr *)&here, sizeof here) < 0) {
        perror("sandboxd-judge: netlink");
        return -1;
    }
    int size = 1 << 22; /* a burst of queued packets waits here, not lost */
    setsockopt(nl, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size);
    char attrs[64];
    size_t len = 0;
    struct nfqnl_msg_config_cmd bind_cmd = {.command = NFQNL_CFG_CMD_BIND};
    put_attr(attrs, &len, NFQA_CFG_CMD, &bind_cmd, sizeof bind_cmd);
    if (send_msg(NFQNL_MSG_CONFIG, attrs, len, NLM_F_ACK) != 0 || acked("bind") != 0)
        return -1;
    len = 0;
    struct nfqnl_msg_config_params params = {.copy_range = htonl(COPY_RANGE),
                                             .copy_mode = NFQNL_COPY_PACKET};
    put_attr(attrs, &len, NFQA_CFG_PARAMS, &params, sizeof params);
    unsigned maxlen = htonl(QUEUE_MAXLEN);
    put_attr(attrs, &len, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
    if (send_msg(NFQNL_MSG_CONFIG, attrs, len, NLM_F_ACK) != 0)
        return -1;
    return acked("config");
}
