/* vmm_hosts_private.h — what vmm_hosts.c (calls, placement, health) and
 * vmm_watch.c (the probes, the cancels, the host registry) share of
 * tally-api's hosts. Only these two include it. */
#pragma once

#include "vmm_hosts.h"

#include "client.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Hosts tally-api knows at most: vmm_sockets' and those the host registry adds. */
#define MAX_HOSTS 256

/* A host that does not accept within this is down; every call has its own
 * total bound besides (vmm_hosts.h). */
#define VMM_CONNECT_TIMEOUT_MS 5000
/* The watch: GET /v1/status on each host this often, answered within this. */
#define PROBE_PERIOD_MS  2000
#define PROBE_TIMEOUT_MS 1500
/* A call waits this long for one of its host's slots, then is refused. */
#define SLOT_WAIT_MS 500
/* Placement scores this many ready hosts in turn (all of them when fewer). */
#define PLACE_SAMPLE 3
/* Cancels of creates that ended unanswered, kept per host until it answers. */
#define CANCELS_MAX 64

/* A host's room as its last probe said (MiB): what it may promise and what
 * it has; known once a probe carried them. */
struct room {
        int64_t cap[3], promised[3];
        bool known;
};

/* What tally-api knows of one host: its calls in flight (at most limit: a
 * hung host holds at most that many of the API's threads) and what the
 * watch saw last. */
struct host {
        pthread_mutex_t lock;
        pthread_cond_t freed;
        int in_flight;
        atomic_bool down;      /* the last probe or connect failed */
        atomic_llong last_ok;  /* wall ns of the last answered probe; 0: none yet */
        char host_id[128];     /* its /v1/status "host", "" until one answered; under lock */
        char named[64];        /* the HOST_ID of an https entry (its certificate's name), "" for a socket */
        struct room room;      /* under lock */
        /* the host registry's state of it (host_states; "" when the registry
         * has no row of it, as when hosts do not register), under lock */
        char registry[16];
        /* added from the host registry (vmm_hosts_set_states): its address
         * there, and whether a later, different one was logged (while the old
         * address answers it is kept; once it does not, the entry is replaced
         * by one at the new address) */
        bool from_registry;
        char address[520];
        bool moved_said;
        atomic_bool duplicate; /* its host is reached through an earlier entry (the watch) */
        atomic_bool replaced;  /* a registry host whose row now says another address (vmm_watch.c) */
        /* request ids of creates whose call ended with no answer: the watch
         * sends each a POST /v1/creates/cancel once the host answers */
        char cancels[CANCELS_MAX][65];
        int ncancels;          /* under lock */
        pthread_t watch;
        bool watching;
};

struct vmm_hosts {
        struct vmm_client *host[MAX_HOSTS];
        struct host state[MAX_HOSTS];
        atomic_int n;          /* grows (vmm_hosts_set_states) while calls read it: entry n is whole first */
        int limit; /* calls in flight per host */
        atomic_uint next;
        pthread_mutex_t stop_lock;
        pthread_cond_t stop_cond;
        bool stopping;
        bool discover;         /* add the registry's https hosts */
        char *tls_cert, *tls_key, *tls_ca; /* for them: vmm_tls_* (copies) */
};

/* Sizes as placement counts them: 0 to 2^40 (vmm_hosts.c). */
int64_t vmm_hosts_room_clamp(int64_t v);
/* CLOCK_REALTIME ms from now, for pthread_cond_timedwait. */
struct timespec vmm_hosts_deadline_in(long ms);
/* One entry's client (vmm_sockets' form). Returns 0, or -errno with err filled. */
int vmm_hosts_client_new(const char *entry, const struct vmm_hosts_tls *tls, struct vmm_client **ret, char *err,
                         size_t errlen);
/* Whether s[0..n) is a host id as certificates name them (1..63 of A-Z a-z 0-9 . _ -). */
bool vmm_hosts_id_valid(const char *s, size_t n);
/* Starts host i's watch thread. 0 or -errno. */
int vmm_hosts_watch_one(struct vmm_hosts *h, int i);
