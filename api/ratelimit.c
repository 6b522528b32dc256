/* ratelimit.c — see ratelimit.h. Tokens are counted in thousandths so that a
 * rate of a few a second refills smoothly at microsecond steps. */
#include "ratelimit.h"

#include "timeutil.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 4096
#define PROBES 16

struct slot {
        char key[200];
        int64_t a; /* milli-tokens */
        int64_t t; /* last refill (us) */
};

struct ratelimit {
        int64_t per_s, burst;
        pthread_mutex_t lock;
        struct slot slots[SLOTS];
};

int ratelimit_new(int64_t per_s, int64_t burst, struct ratelimit **ret)
{
        if (per_s < 1 || burst < 0)
                return -EINVAL;
        struct ratelimit *rl = calloc(1, sizeof(*rl));
        if (!rl)
                return -ENOMEM;
        rl->per_s = per_s;
        rl->burst = burst;
        pthread_mutex_init(&rl->lock, NULL);
        *ret = rl;
        return 0;
}

void ratelimit_free(struct ratelimit *rl)
{
        if (!rl)
                return;
        pthread_mutex_destroy(&rl->lock);
        free(rl);
}

/* The slot of key: its own, a free one, or (table full) the one it hashes to, reset. */
static struct slot *slot_of(struct slot *table, const char *key, bool *ret_new)
{
        uint64_t h = 1469598103934665603ULL;
        for (const char *p = key; *p; p++)
                h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        size_t start = (size_t)(h % SLOTS);
        for (size_t i = 0; i < PROBES; i++) {
                struct slot *s = &table[(start + i) % SLOTS];
                if (strcmp(s->key, key) == 0) {
                        *ret_new = false;
                        return s;
                }
                if (!s->key[0]) {
                        snprintf(s->key, sizeof(s->key), "%s", key);
                        *ret_new = true;
                        return s;
                }
        }
        struct slot *s = &table[start];
        snprintf(s->key, sizeof(s->key), "%s", key);
        *ret_new = true;
        return s;
}

bool ratelimit_allow(struct ratelimit *rl, const char *who, int64_t *ret_retry_s)
{
        int64_t now = time_mono_ns() / NS_PER_US, cap = rl->burst * 1000;
        pthread_mutex_lock(&rl->lock);
        bool fresh;
        struct slot *s = slot_of(rl->slots, who, &fresh);
        if (fresh) {
                s->a = cap;
                s->t = now;
        }
        /* per_s tokens a second = per_s milli-tokens a millisecond */
        int64_t add = (now - s->t) * rl->per_s / 1000;
        if (add > 0) {
                s->a = s->a + add > cap ? cap : s->a + add;
                s->t = now;
        }
        bool ok = s->a >= 1000;
        if (ok)
                s->a -= 1000;
        int64_t need_us = ok ? 0 : (1000 - s->a) * 1000 / rl->per_s;
        pthread_mutex_unlock(&rl->lock);
        if (!ok)
                *ret_retry_s = need_us / 1000000 + 1;
        return ok;
}
