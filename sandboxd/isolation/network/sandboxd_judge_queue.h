/*
 * What the kernel queued: netlink messages, each one packet with its id, mark and the sandbox's
 * veth (its input interface), read down to the TCP segment segment() judges. A packet that is
 * not TCP over IPv4 or IPv6 without extension headers, or is cut short, is refused; a SYN that
 * carries data (TCP Fast Open) is dropped (the client sends it again without). Included by
 * sandboxd_judge.c only.
 */
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

enum { TCP_SYN = 0x02 };

static void packet(unsigned id, unsigned mark, unsigned ifindex, const unsigned char *ip,
                   size_t n) {
    struct address s = {0}, d = {0};
    size_t header;
    if (n >= 20 && ip[0] >> 4 == 4) {
        header = (size_t)(ip[0] & 0xf) * 4;
        size_t total = be16(ip + 2);
        if (ip[9] != IPPROTO_TCP || header < 20 || total > n || total < header)
            goto refuse;
        n = total;
        s.family = d.family = AF_INET;
        memcpy(s.addr, ip + 12, 4);
        memcpy(d.addr, ip + 16, 4);
    } else if (n >= 40 && ip[0] >> 4 == 6) {
        header = 40;
        size_t total = 40 + be16(ip + 4);
        if (ip[6] != IPPROTO_TCP || total > n)
            goto refuse;
        n = total;
        s.family = d.family = AF_INET6;
        memcpy(s.addr, ip + 8, 16);
        memcpy(d.addr, ip + 24, 16);
    } else {
        goto refuse;
    }
    if (n < header + 20)
        goto refuse;
    const unsigned char *tcp = ip + header;
    size_t data = (size_t)(tcp[12] >> 4) * 4;
    if (data < 20 || header + data > n)
        goto refuse;
    unsigned seq = (unsigned)tcp[4] << 24 | (unsigned)tcp[5] << 16 | (unsigned)tcp[6] << 8 | tcp[7];
    if (tcp[13] & TCP_SYN) {
        verdict(id, n > header + data ? NF_DROP : NF_REPEAT, 1,
                mark & ~(judge_mark | allow_mark | refuse_mark));
        return;
    }
    segment(id, mark, ifindex, &s, &d, be16(tcp), be16(tcp + 2), seq, tcp + data,
            n - header - data);
    return;
refuse:
    verdict(id, NF_REPEAT, 1, (mark & ~(judge_mark | allow_mark)) | refuse_mark);
}

/* The kernel numbers a queue's packets in order: ids skipped between two messages were lost
 * (the socket's buffer overflowed, ENOBUFS). Left without a verdict they would stay queued for
 * ever and fill the queue; they are dropped (their connections send them again). */
static void drop_lost(unsigned id) {
    static unsigned last;
    if (last != 0 && id - last > 1 && id - last <= QUEUE_MAXLEN)
        for (unsigned lost = last + 1; lost != id; lost++)
            verdict(lost, NF_DROP, 0, 0);
    last = id;
}

/* Every message the queue has ready; -1 when the netlink socket fails. */
static int read_queue(void) {
    static char buf[1 << 17];
    for (;;) {
        ssize_t got = recv(nl, buf, sizeof buf, MSG_DONTWAIT);
        if (got < 0)
            return errno == EAGAIN || errno == ENOBUFS ? 0 : (perror("sandboxd-judge: recv"), -1);
        int left = (int)got; /* (signed: NLMSG_NEXT steps past an unpadded last message) */
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, left);
             h = NLMSG_NEXT(h, left)) {
            if (h->nlmsg_type != ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET))
                continue;
            unsigned id = 0, mark = 0, ifindex = 0;
            int have_id = 0;
            const unsigned char *ip = NULL;
            size_t ip_len = 0;
            size_t at = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(struct nfgenmsg));
            while (at + NLA_HDRLEN <= h->nlmsg_len) {
                struct nlattr *a = (struct nlattr *)((char *)h + at);
                if (a->nla_len < NLA_HDRLEN || at + a->nla_len > h->nlmsg_len)
                    break;
                const unsigned char *value = (const unsigned char *)a + NLA_HDRLEN;
                size_t size = a->nla_len - NLA_HDRLEN;
                unsigned word = 0;
                if (size >= 4)
                    memcpy(&word, value, 4);
                switch (a->nla_type & NLA_TYPE_MASK) {
                case NFQA_PACKET_HDR:
                    if (size >= sizeof(struct nfqnl_msg_packet_hdr)) {
                        id = ntohl(((const struct nfqnl_msg_packet_hdr *)value)->packet_id);
                        have_id = 1;
                    }
                    break;
                case NFQA_MARK:
                    mark = ntohl(word);
                    break;
                case NFQA_IFINDEX_INDEV:
                    ifindex = ntohl(word);
                    break;
                case NFQA_PAYLOAD:
                    ip = value;
                    ip_len = size;
                    break;
                }
                at += NLA_ALIGN(a->nla_len);
            }
            if (!have_id)
                continue;
            drop_lost(id);
            packet(id, mark, ifindex, ip ? ip : (const unsigned char *)"", ip ? ip_len : 0);
        }
    }
}
