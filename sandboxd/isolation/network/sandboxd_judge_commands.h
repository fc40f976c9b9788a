/*
 * The daemon's lines on stdin ("policy", "forget", "addresses": sandboxd_judge.c lists them).
 * A line that cannot be read is an error on stderr and ignored: the policy it would have set
 * stays as it was (none: that sandbox's connections are refused). Included by sandboxd_judge.c
 * only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const size_t LINE_MAX_BYTES = 8u << 20; /* a policy of a few thousand names fits */

static int add_name(char ***names, size_t *n, const char *text) {
    size_t len = strlen(text);
    if (len == 0 || len > MAX_NAME + 2)
        return 0;
    char **grown = realloc(*names, (*n + 1) * sizeof **names);
    if (grown == NULL)
        return 0;
    *names = grown;
    return ((*names)[(*n)++] = strdup(text)) != NULL;
}

static int add_net(struct net **nets, size_t *n, const char *text) {
    struct net net;
    if (!parse_net(text, &net))
        return 0;
    struct net *grown = realloc(*nets, (*n + 1) * sizeof **nets);
    if (grown == NULL)
        return 0;
    *nets = grown;
    (*nets)[(*n)++] = net;
    return 1;
}

static void policy_line(char *rest) {
    char *save = NULL, *ifindex = strtok_r(rest, " ", &save);
    char *wins = strtok_r(NULL, " ", &save), *has_allow = strtok_r(NULL, " ", &save);
    if (ifindex == NULL || wins == NULL || has_allow == NULL) {
        fprintf(stderr, "sandboxd-judge: a policy line without its fields\n");
        return;
    }
    struct policy *p = calloc(1, sizeof *p);
    if (p == NULL)
        return;
    p->ifindex = (unsigned)strtoul(ifindex, NULL, 10);
    p->wins = strcmp(wins, "1") == 0;
    p->has_allow = strcmp(has_allow, "1") == 0;
    for (char *entry; (entry = strtok_r(NULL, " ", &save)) != NULL;) {
        int allow = entry[0] == '+', ok;
        if (entry[0] != '+' && entry[0] != '-')
            ok = 0;
        else if (strchr(entry, '/'))
            ok = allow ? add_net(&p->allow_nets, &p->n_allow_nets, entry + 1)
                       : add_net(&p->deny_nets, &p->n_deny_nets, entry + 1);
        else
            ok = allow ? add_name(&p->allow_names, &p->n_allow_names, entry + 1)
                       : add_name(&p->deny_names, &p->n_deny_names, entry + 1);
        if (!ok) {
            fprintf(stderr, "sandboxd-judge: policy %u: %s cannot be read\n", p->ifindex, entry);
            free_policy(p);
            return;
        }
    }
    keep_policy(p);
}

static void addresses_line(char *rest) {
    char *save = NULL, *text = strtok_r(rest, " ", &save), *ttl = strtok_r(NULL, " ", &save);
    if (text == NULL || ttl == NULL || strlen(text) > MAX_NAME)
        return;
    struct name *n = name_of(text);
    if (n == NULL && (n = new_name(text)) == NULL)
        return;
    n->n_addresses = 0;
    for (char *a; (a = strtok_r(NULL, " ", &save)) != NULL && n->n_addresses < ADDRESSES_MAX;) {
        struct address *slot = &n->addresses[n->n_addresses];
        memset(slot, 0, sizeof *slot);
        slot->family = strchr(a, ':') ? AF_INET6 : AF_INET;
        if (inet_pton(slot->family, a, slot->addr) == 1)
            n->n_addresses++;
    }
    n->pending = 0;
    n->expires = now() + strtod(ttl, NULL);
    answered(text);
}

static void command(char *line) {
    char *rest = strchr(line, ' ');
    if (rest)
        *rest++ = '\0';
    else
        rest = line + strlen(line);
    if (strcmp(line, "policy") == 0)
        policy_line(rest);
    else if (strcmp(line, "forget") == 0)
        forget_policy((unsigned)strtoul(rest, NULL, 10));
    else if (strcmp(line, "addresses") == 0)
        addresses_line(rest);
    else
        fprintf(stderr, "sandboxd-judge: unknown command %s\n", line);
}

/* Whatever stdin has: 0 read (more may come), 1 at its end, -1 on an error or a line longer
 * than LINE_MAX_BYTES. */
static int read_commands(void) {
    static char *buf;
    static size_t len, size;
    if (size - len < 65536) {
        size_t want = size ? size * 2 : 1 << 16;
        if (want > LINE_MAX_BYTES + 65536)
            want = LINE_MAX_BYTES + 65536;
        char *grown = want > size ? realloc(buf, want) : NULL;
        if (grown == NULL) {
            fprintf(stderr, "sandboxd-judge: a line longer than %zu bytes\n", LINE_MAX_BYTES);
            return -1;
        }
        buf = grown;
        size = want;
    }
    ssize_t got = read(STDIN_FILENO, buf + len, size - len);
    if (got == 0)
        return 1;
    if (got < 0)
        return errno == EINTR || errno == EAGAIN ? 0 : -1;
    len += (size_t)got;
    char *start = buf, *end;
    while ((end = memchr(start, '\n', len - (size_t)(start - buf))) != NULL) {
        *end = '\0';
        command(start);
        start = end + 1;
    }
    len -= (size_t)(start - buf);
    memmove(buf, start, len);
    return 0;
}
