/* The judge of bench/egress_judge.py in C (--judge-c): the same verdicts as its Python
 * loop, to tell how much of a queued packet's cost is the interpreter's. HTTP only: the
 * name is the Host header's; a packet without one is refused.
 *
 *   egress_judge QUEUE NAME     prints "up" once bound, then judges for ever
 */
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

enum { ALLOW_MARK = 1, REFUSE_MARK = 2 };

static int nl;
static unsigned short queue;

static void put_attr(char *buf, size_t *len, unsigned short type, const void *data, size_t n) {
    struct nlattr *a = (struct nlattr *)(buf + *len);
    a->nla_len = (unsigned short)(NLA_HDRLEN + n);
    a->nla_type = type;
    memcpy(buf + *len + NLA_HDRLEN, data, n);
    *len += NLA_ALIGN(NLA_HDRLEN + n);
}

static void send_msg(int kind, const char *attrs, size_t attrs_len) {
    char buf[256];
    struct nlmsghdr *h = (struct nlmsghdr *)buf;
    struct nfgenmsg *g = (struct nfgenmsg *)(buf + NLMSG_HDRLEN);
    size_t len = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof *g);
    memset(buf, 0, len);
    memcpy(buf + len, attrs, attrs_len);
    len += attrs_len;
    h->nlmsg_len = (unsigned)len;
    h->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | kind;
    h->nlmsg_flags = NLM_F_REQUEST;
    g->nfgen_family = AF_UNSPEC;
    g->res_id = htons(queue);
    if (send(nl, buf, len, 0) < 0) {
        perror("send");
        exit(1);
    }
}

/* Whether the HTTP request in payload names `name` in its Host header. */
static int names(const char *payload, size_t n, const char *name) {
    size_t want = strlen(name);
    for (size_t i = 0; i + 8 + want <= n; i++) {
        if (payload[i] == '\n' && strncasecmp(payload + i + 1, "host:", 5) == 0) {
            size_t at = i + 6;
            while (at < n && payload[at] == ' ')
                at++;
            return at + want + 1 < n && strncasecmp(payload + at, name, want) == 0 &&
                   (payload[at + want] == '\r' || payload[at + want] == '\n');
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: egress_judge QUEUE NAME\n");
        return 2;
    }
    queue = (unsigned short)atoi(argv[1]);
    nl = socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
    struct sockaddr_nl here = {.nl_family = AF_NETLINK};
    if (nl < 0 || bind(nl, (struct sockaddr *)&here, sizeof here) < 0) {
        perror("netlink");
        return 1;
    }
    char attrs[64];
    size_t len = 0;
    struct nfqnl_msg_config_cmd bind_cmd = {.command = NFQNL_CFG_CMD_BIND};
    put_attr(attrs, &len, NFQA_CFG_CMD, &bind_cmd, sizeof bind_cmd);
    send_msg(NFQNL_MSG_CONFIG, attrs, len);
    len = 0;
    struct nfqnl_msg_config_params params = {.copy_range = htonl(4096),
                                             .copy_mode = NFQNL_COPY_PACKET};
    put_attr(attrs, &len, NFQA_CFG_PARAMS, &params, sizeof params);
    send_msg(NFQNL_MSG_CONFIG, attrs, len);
    printf("up\n");
    fflush(stdout);
    static char buf[1 << 17];
    for (;;) {
        ssize_t got = recv(nl, buf, sizeof buf, 0);
        if (got < 0) {
            perror("recv");
            return 1;
        }
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)got);
             h = NLMSG_NEXT(h, got)) {
            if (h->nlmsg_type != ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET))
                continue;
            unsigned id = 0;
            const unsigned char *ip = NULL;
            size_t ip_len = 0;
            size_t at = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(struct nfgenmsg));
            while (at + NLA_HDRLEN <= h->nlmsg_len) {
                struct nlattr *a = (struct nlattr *)((char *)h + at);
                if (a->nla_len < NLA_HDRLEN)
                    break;
                int type = a->nla_type & NLA_TYPE_MASK;
                if (type == NFQA_PACKET_HDR)
                    id = ntohl(((struct nfqnl_msg_packet_hdr *)((char *)a + NLA_HDRLEN))->packet_id);
                else if (type == NFQA_PAYLOAD) {
                    ip = (const unsigned char *)a + NLA_HDRLEN;
                    ip_len = a->nla_len - NLA_HDRLEN;
                }
                at += NLA_ALIGN(a->nla_len);
            }
            int allowed = 0;
            if (ip && ip_len >= 40) {
                size_t tcp = (size_t)(ip[0] & 0xF) * 4;
                size_t data = tcp + (size_t)(ip[tcp + 12] >> 4) * 4;
                if (data < ip_len)
                    allowed = names((const char *)ip + data, ip_len - data, argv[2]);
            }
            char verdict[64];
            size_t vlen = 0;
            struct nfqnl_msg_verdict_hdr v = {.verdict = htonl(NF_REPEAT), .id = htonl(id)};
            put_attr(verdict, &vlen, NFQA_VERDICT_HDR, &v, sizeof v);
            unsigned mark = htonl(allowed ? ALLOW_MARK : REFUSE_MARK);
            put_attr(verdict, &vlen, NFQA_MARK, &mark, sizeof mark);
            send_msg(NFQNL_MSG_VERDICT, verdict, vlen);
        }
    }
}
