/*
 * The judge's view of each judged sandbox's egress policy and of the names the daemon
 * resolved, and the verdict refusal() in egress_verdict.py gives (the operator's deny list
 * aside: the daemon's ruleset refuses those addresses before a connection is made). Included
 * by sandboxd_judge.c only.
 */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { POLICY_BUCKETS = 1024, NAME_BUCKETS = 4096, NAMES_MAX = 4096, ADDRESSES_MAX = 64 };

struct net {
    int family;
    unsigned char addr[16];
    unsigned prefix;
};

struct policy {
    unsigned ifindex;
    int wins;      /* allow_wins: what allow_out names goes on before deny_out is looked at */
    int has_allow; /* allow_out is not None */
    char **allow_names, **deny_names;
    size_t n_allow_names, n_deny_names;
    struct net *allow_nets, *deny_nets;
    size_t n_allow_nets, n_deny_nets;
    unsigned flows;  /* its connections being judged */
    size_t buffered; /* the first bytes held of them */
    struct policy *next;
};

static struct policy *policies[POLICY_BUCKETS];

struct address {
    int family;
    unsigned char addr[16];
};

/* A name the daemon was asked to resolve: its addresses once answered (kept until expires),
 * or pending (asked, not answered yet). */
struct name {
    char text[MAX_NAME + 1];
    int pending;
    double asked, expires;
    size_t n_addresses;
    struct address addresses[ADDRESSES_MAX];
    struct name *next, *older, *newer;
};

static struct name *names[NAME_BUCKETS];
static struct name *oldest, *newest;
static size_t n_names;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static unsigned hash(const char *text) {
    unsigned h = 2166136261u;
    for (; *text; text++)
        h = (h ^ (unsigned char)*text) * 16777619u;
    return h;
}

static struct policy *policy_of(unsigned ifindex) {
    for (struct policy *p = policies[ifindex % POLICY_BUCKETS]; p; p = p->next)
        if (p->ifindex == ifindex)
            return p;
    return NULL;
}

static void free_policy(struct policy *p) {
    for (size_t i = 0; i < p->n_allow_names; i++)
        free(p->allow_names[i]);
    for (size_t i = 0; i < p->n_deny_names; i++)
        free(p->deny_names[i]);
    free(p->allow_names);
    free(p->deny_names);
    free(p->allow_nets);
    free(p->deny_nets);
    free(p);
}

static void forget_policy(unsigned ifindex) {
    for (struct policy **at = &policies[ifindex % POLICY_BUCKETS]; *at; at = &(*at)->next)
        if ((*at)->ifindex == ifindex) {
            struct policy *gone = *at;
            *at = gone->next;
            free_policy(gone);
            return;
        }
}

static void keep_policy(struct policy *p) {
    struct policy *old = policy_of(p->ifindex);
    p->flows = old ? old->flows : 0;
    p->buffered = old ? old->buffered : 0;
    forget_policy(p->ifindex);
    p->next = policies[p->ifindex % POLICY_BUCKETS];
    policies[p->ifindex % POLICY_BUCKETS] = p;
}

/* "ADDRESS/PREFIX" into a net; 0 when it is not one. */
static int parse_net(const char *text, struct net *net) {
    char copy[64];
    const char *slash = strchr(text, '/');
    size_t len = slash ? (size_t)(slash - text) : strlen(text);
    if (len >= sizeof copy)
        return 0;
    memcpy(copy, text, len);
    copy[len] = '\0';
    net->family = strchr(copy, ':') ? AF_INET6 : AF_INET;
    if (inet_pton(net->family, copy, net->addr) != 1)
        return 0;
    unsigned most = net->family == AF_INET ? 32 : 128;
    net->prefix = slash ? (unsigned)strtoul(slash + 1, NULL, 10) : most;
    return net->prefix <= most;
}

static int in_net(const struct net *net, const struct address *a) {
    if (net->family != a->family)
        return 0;
    unsigned whole = net->prefix / 8, rest = net->prefix % 8;
    if (memcmp(net->addr, a->addr, whole) != 0)
        return 0;
    if (rest == 0)
        return 1;
    unsigned char mask = (unsigned char)(0xff << (8 - rest));
    return (net->addr[whole] & mask) == (a->addr[whole] & mask);
}

/* matches() of egress_names.py: "*.example.com" names every name below example.com. */
static int matches(const char *pattern, const char *name) {
    if (pattern[0] == '*' && pattern[1] == '.') {
        size_t p = strlen(pattern + 1), n = strlen(name);
        return n > p && strcmp(name + n - p, pattern + 1) == 0;
    }
    return strcmp(pattern, name) == 0;
}

static int any_name(char *const *patterns, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (matches(patterns[i], name))
            return 1;
    return 0;
}

static int any_net(const struct net *nets, size_t n, const struct address *a) {
    for (size_t i = 0; i < n; i++)
        if (in_net(&nets[i], a))
            return 1;
    return 0;
}

/* Why the policy refuses name at a ("denied", "not_allowed"), or NULL when it may go out. */
static const char *refusal(const struct policy *p, const char *name, const struct address *a) {
    int allowed = any_name(p->allow_names, p->n_allow_names, name) ||
                  any_net(p->allow_nets, p->n_allow_nets, a);
    if (p->wins && allowed)
        return NULL;
    if (any_name(p->deny_names, p->n_deny_names, name) ||
        any_net(p->deny_nets, p->n_deny_nets, a))
        return "denied";
    if (p->wins || !p->has_allow || allowed)
        return NULL;
    return "not_allowed";
}

static struct name *name_of(const char *text) {
    for (struct name *n = names[hash(text) % NAME_BUCKETS]; n; n = n->next)
        if (strcmp(n->text, text) == 0)
            return n;
    return NULL;
}

static void unlink_name(struct name *n) {
    for (struct name **at = &names[hash(n->text) % NAME_BUCKETS]; *at; at = &(*at)->next)
        if (*at == n) {
            *at = n->next;
            break;
        }
    if (n->older)
        n->older->newer = n->newer;
    else
        oldest = n->newer;
    if (n->newer)
        n->newer->older = n->older;
    else
        newest = n->older;
    n_names--;
}

/* A new pending entry for text (the oldest answered one goes when NAMES_MAX are kept; NULL
 * when every kept name is pending). */
static struct name *new_name(const char *text) {
    if (n_names >= NAMES_MAX) {
        struct name *victim = oldest;
        while (victim && victim->pending)
            victim = victim->newer;
        if (victim == NULL)
            return NULL;
        unlink_name(victim);
        free(victim);
    }
    struct name *n = calloc(1, sizeof *n);
    if (n == NULL)
        return NULL;
    strcpy(n->text, text);
    n->pending = 1;
    n->asked = now();
    unsigned b = hash(text) % NAME_BUCKETS;
    n->next = names[b];
    names[b] = n;
    n->older = newest;
    if (newest)
        newest->newer = n;
    else
        oldest = n;
    newest = n;
    n_names++;
    return n;
}

static int resolved_to(const struct name *n, const struct address *a) {
    for (size_t i = 0; i < n->n_addresses; i++)
        if (n->addresses[i].family == a->family &&
            memcmp(n->addresses[i].addr, a->addr, a->family == AF_INET ? 4 : 16) == 0)
            return 1;
    return 0;
}
