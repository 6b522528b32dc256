/* backend.c — the one table of sandbox backends, and what "auto" means.
 * The qemu slot is filled when vmm/qemu/ is built (VMM_HAVE_QEMU) and its
 * backend ops are linked in as qemu_backend. */
#include "backend.h"
#include "process.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const struct backend_ops *const backends[] = {
        &process_backend,
#ifdef VMM_HAVE_QEMU
        &qemu_backend,
#endif
};
#define BACKEND_COUNT (sizeof(backends) / sizeof(backends[0]))

const struct backend_ops *backend_find(const char *name)
{
        for (size_t i = 0; i < BACKEND_COUNT; i++)
                if (strcmp(backends[i]->name, name) == 0)
                        return backends[i];
        return NULL;
}

const char *backend_names(void)
{
#ifdef VMM_HAVE_QEMU
        return "auto, process, qemu";
#else
        return "auto, process (qemu is not built)";
#endif
}

static bool usable(const struct backend_ops *b, char *why, size_t whylen)
{
        return !b->available || b->available(why, whylen);
}

const struct backend_ops *backend_resolve(const char *name, const char **ret_reason, char *why, size_t whylen)
{
        const char *reason = "asked for by name";
        const struct backend_ops *b = NULL;
        if (strcmp(name, "auto") == 0) {
                const struct backend_ops *qemu = backend_find("qemu");
                char ignored[256];
                if (!qemu) {
                        reason = "auto: the qemu backend is not built";
                } else if (!usable(qemu, ignored, sizeof(ignored))) {
                        reason = "auto: qemu is not available on this host";
                } else if (!qemu->accelerated || !qemu->accelerated()) {
                        /* A /dev/kvm that opens is not proof: the probe boots a guest. */
                        reason = "auto: KVM does not boot a guest here (qemu would run under TCG)";
                } else {
                        b = qemu;
                        reason = "auto: KVM is available";
                }
                if (!b)
                        b = &process_backend;
        } else {
                b = backend_find(name);
                if (!b) {
                        snprintf(why, whylen, "unknown backend \"%s\" (have: %s)", name, backend_names());
                        return NULL;
                }
        }
        if (!usable(b, why, whylen))
                return NULL;
        if (ret_reason)
                *ret_reason = reason;
        return b;
}
