/*
 * The connections being judged: each one's first payload, gathered in sequence from the packets
 * the kernel queued (held, without a verdict, until the name is whole and judged), and, once
 * judged, its verdict for a while: a packet queued before the ruleset saved the verdict on the
 * connection gets the same, and only such a packet, the one that continues the judged bytes
 * exactly (a new connection on the same addresses and ports, which the kernel marks pending
 * anew, starts at a sequence number of its own and is judged afresh). Included by
 * sandboxd_judge.c only.
 */
#include <linux/netfilter.h>
#include <stdlib.h>
#include <string.h>

enum {
    FLOW_BUCKETS = 4096,
    FLOWS_MAX = 4096,        /* connections judged at once, all sandboxes */
    FLOWS_PER_SANDBOX = 256, /* of one sandbox */
    HELD_MAX = 32,           /* packets held for one connection (more are dropped) */
    FLOW_TIMEOUT = 10,       /* seconds a connection may take to be judged */
    DECIDED_KEEP = 2,        /* seconds a verdict is kept for packets queued before it */
    DECIDED_MAX = 16384,     /* verdicts kept at once (the oldest go first) */
};
enum { UNDECIDED, ALLOWED, REFUSED };
static const size_t BUFFERED_MAX = 16u << 20; /* bytes of first payloads held, all connections */
static const size_t SANDBOX_BUFFERED_MAX = 1u << 20; /* of one sandbox's connections */

struct flow {
    unsigned ifindex;
    struct address source, destination;
    unsigned short sport, dport;
    unsigned first_seq, next_seq;
    unsigned char *buffer;
    size_t len;
    unsigned held[HELD_MAX], held_marks[HELD_MAX];
    size_t n_held;
    double since;
    int state;
    char name[MAX_NAME + 1]; /* once peeked */
    struct flow *next;
    struct flow *newer; /* decided: the next one decided (kept in the order of their verdicts) */
};

static struct flow *flows[FLOW_BUCKETS];
static size_t n_flows, n_decided, buffered; /* n_flows: undecided; they alone count to bounds */
static struct flow *oldest_decided, *newest_decided;

static unsigned flow_hash(unsigned ifindex, const struct address *s, const struct address *d,
                          unsigned short sport, unsigned short dport) {
    unsigned h = ifindex * 2654435761u ^ ((unsigned)sport << 16 | dport);
    for (int i = 0; i < 16; i++)
        h = (h ^ s->addr[i] ^ (unsigned)d->addr[i] << 8) * 16777619u;
    return h % FLOW_BUCKETS;
}

static struct flow *flow_of(unsigned ifindex, const struct address *s, const struct address *d,
                            unsigned short sport, unsigned short dport) {
    for (struct flow *f = flows[flow_hash(ifindex, s, d, sport, dport)]; f; f = f->next)
        if (f->ifindex == ifindex && f->sport == sport && f->dport == dport &&
            memcmp(&f->source, s, sizeof *s) == 0 && memcmp(&f->destination, d, sizeof *d) == 0)
            return f;
    return NULL;
}

static void drop_buffer(struct flow *f) {
    struct policy *p = policy_of(f->ifindex);
    if (p != NULL)
        p->buffered -= f->len < p->buffered ? f->len : p->buffered;
    buffered -= f->len;
    free(f->buffer);
    f->buffer = NULL;
    f->len = 0;
}

/* Forget f: an undecided one counts no more against the bounds; a decided one must be the
 * oldest verdict kept (they go in the order they were made). */
static void unhash(struct flow *f) {
    unsigned b = flow_hash(f->ifindex, &f->source, &f->destination, f->sport, f->dport);
    for (struct flow **at = &flows[b]; *at; at = &(*at)->next)
        if (*at == f) {
            *at = f->next;
            return;
        }
}

static void free_flow(struct flow *f) {
    unhash(f);
    drop_buffer(f);
    if (f->state == UNDECIDED) {
        struct policy *p = policy_of(f->ifindex);
        if (p != NULL && p->flows)
            p->flows--;
        n_flows--;
    } else {
        oldest_decided = f->newer;
        if (oldest_decided == NULL)
            newest_decided = NULL;
        n_decided--;
    }
    free(f);
}

static const char *address_text(const struct address *a, char *text) {
    return inet_ntop(a->family, a->addr, text, INET6_ADDRSTRLEN) ? text : "?";
}

/* Every held packet of f goes on, allowed or refused (the ruleset resets a refused one). */
static void settle(struct flow *f, int state, const char *reason) {
    for (size_t i = 0; i < f->n_held; i++)
        verdict(f->held[i], NF_REPEAT, 1,
                f->held_marks[i] | (state == ALLOWED ? allow_mark : refuse_mark));
    f->n_held = 0;
    struct policy *p = policy_of(f->ifindex);
    if (p != NULL && p->flows)
        p->flows--;
    n_flows--;
    f->state = state;
    f->since = now();
    drop_buffer(f); /* (past DECIDED_MAX, the oldest verdicts go in expire(): none is freed here,
                       while a caller may be walking the flows) */
    if (newest_decided)
        newest_decided->newer = f;
    else
        oldest_decided = f;
    newest_decided = f;
    n_decided++;
    if (reason != NULL) {
        char text[INET6_ADDRSTRLEN];
        say("refused %u %s %s %s\n", f->ifindex, reason, address_text(&f->destination, text),
            f->name);
    }
}

/* Judge f by its name's addresses and its sandbox's policy, or ask the daemon for them. */
static void judge(struct flow *f) {
    struct name *n = name_of(f->name);
    if (n != NULL && n->pending)
        return; /* judge() again when the answer comes */
    if (n == NULL || n->expires <= now()) {
        if (n == NULL && (n = new_name(f->name)) == NULL) {
            settle(f, REFUSED, "too_many");
            return;
        }
        n->pending = 1;
        n->asked = now();
        say("resolve %s\n", f->name);
        return;
    }
    const struct policy *p = policy_of(f->ifindex);
    const char *reason = NULL;
    if (p == NULL)
        reason = "no_policy";
    else if (n->n_addresses == 0)
        reason = "unresolved";
    else if (!resolved_to(n, &f->destination))
        reason = "mismatch";
    else
        reason = refusal(p, f->name, &f->destination);
    settle(f, reason ? REFUSED : ALLOWED, reason);
}

/* A name's addresses came: every connection waiting for them is judged. */
static void answered(const char *text) {
    for (size_t b = 0; b < FLOW_BUCKETS; b++)
        for (struct flow *f = flows[b], *next; f; f = next) {
            next = f->next;
            if (f->state == UNDECIDED && f->n_held && f->name[0] && strcmp(f->name, text) == 0)
                judge(f);
        }
}

/* One queued TCP segment of a judged sandbox (payload: its data, perhaps empty). */
static void segment(unsigned id, unsigned mark, unsigned ifindex, const struct address *s,
                    const struct address *d, unsigned short sport, unsigned short dport,
                    unsigned seq, const unsigned char *payload, size_t len) {
    mark &= ~(judge_mark | allow_mark | refuse_mark);
    if (len == 0) {
        verdict(id, NF_REPEAT, 1, mark);
        return;
    }
    struct flow *f = flow_of(ifindex, s, d, sport, dport);
    if (f != NULL && f->state != UNDECIDED) {
        if (seq == f->next_seq) {
            f->next_seq += (unsigned)len;
            verdict(id, NF_REPEAT, 1, mark | (f->state == ALLOWED ? allow_mark : refuse_mark));
            return;
        }
        if (seq - f->first_seq < f->next_seq - f->first_seq) {
            verdict(id, NF_DROP, 0, 0); /* a resend of bytes judged already (they went on) */
            return;
        }
        unhash(f); /* another connection on the same addresses and ports: this verdict is */
        f = NULL;  /* found no more, and goes in its turn */
    }
    if (f == NULL) {
        struct policy *p = policy_of(ifindex);
        const char *reason = p == NULL ? "no_policy" : "too_many";
        if (p == NULL || n_flows >= FLOWS_MAX || p->flows >= FLOWS_PER_SANDBOX ||
            (f = calloc(1, sizeof *f)) == NULL) {
            char text[INET6_ADDRSTRLEN];
            verdict(id, NF_REPEAT, 1, mark | refuse_mark);
            say("refused %u %s %s \n", ifindex, reason, address_text(d, text));
            return;
        }
        *f = (struct flow){.ifindex = ifindex, .source = *s, .destination = *d, .sport = sport,
                           .dport = dport, .first_seq = seq, .next_seq = seq, .since = now()};
        unsigned b = flow_hash(ifindex, s, d, sport, dport);
        f->next = flows[b];
        flows[b] = f;
        n_flows++;
        p->flows++;
    }
    if (seq != f->next_seq || f->n_held == HELD_MAX) {
        verdict(id, NF_DROP, 0, 0); /* a resend of what is held, or out of order: sent again */
        return;
    }
    f->held[f->n_held] = id;
    f->held_marks[f->n_held++] = mark;
    f->next_seq = seq + (unsigned)len;
    if (f->name[0])
        return; /* more of a connection whose name is being resolved */
    size_t take = len;
    if (f->len + take > PEEK_MAX + 5)
        take = PEEK_MAX + 5 - f->len;
    struct policy *p = policy_of(ifindex);
    if (buffered + take > BUFFERED_MAX || p == NULL || p->buffered + take > SANDBOX_BUFFERED_MAX) {
        settle(f, REFUSED, "too_many");
        return;
    }
    unsigned char *grown = realloc(f->buffer, f->len + take);
    if (grown == NULL) {
        settle(f, REFUSED, "too_many");
        return;
    }
    memcpy(grown + f->len, payload, take);
    f->buffer = grown;
    f->len += take;
    buffered += take;
    p->buffered += take;
    char name[MAX_NAME + 1];
    int found = peek_name(f->buffer, f->len, name);
    if (found == PEEK_MORE)
        return;
    if (found == PEEK_NONE) {
        settle(f, REFUSED, "no_name");
        return;
    }
    strcpy(f->name, name);
    drop_buffer(f);
    judge(f);
}

/* Connections not judged in time are refused; verdicts kept long enough are forgotten; a
 * name the daemon did not answer in time is asked again by its next connection. */
static void expire(double at) {
    static double scanned;
    while (oldest_decided && (at - oldest_decided->since > DECIDED_KEEP || n_decided > DECIDED_MAX))
        free_flow(oldest_decided);
    if (at - scanned < 0.1)
        return; /* (the walks below, at most ten times a second) */
    scanned = at;
    for (size_t b = 0; b < FLOW_BUCKETS; b++)
        for (struct flow *f = flows[b], *next; f; f = next) {
            next = f->next;
            if (f->state == UNDECIDED && at - f->since > FLOW_TIMEOUT)
                settle(f, REFUSED, f->name[0] ? "unresolved" : "no_name");
        }
    for (struct name *n = oldest; n; n = n->newer)
        if (n->pending && at - n->asked > FLOW_TIMEOUT) {
            n->pending = 0;
            n->n_addresses = 0;
            n->expires = 0;
        }
}
