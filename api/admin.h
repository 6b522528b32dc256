/* admin.h — tally-admin's two halves: admin.c (accounts, people, keys, plans,
 * months) and admin_status.c (the read-only views). */
#pragma once

#include <libpq-fe.h>

/* `tally-admin status|spend|usage ...`: prints the view; -ENOSYS when argv[0]
 * is none of them, else 0 or a negative errno (said on stderr). */
int admin_view(PGconn *db, int argc, char **argv);
