/* admin.h — tally-admin's insides shared between its two files: admin.c (the
 * program: accounts, people, keys, months) hands its terminal views to
 * admin_status.c. */
#pragma once

#include <libpq-fe.h>

/* Runs `status`, `spend` or `usage` (argv[0]) on db. Returns 0 or a negative
 * errno (said on stderr); -ENOSYS when argv[0] is none of them. */
int admin_view(PGconn *db, int argc, char **argv);

/* admin_timezone.c: `account timezone ACCOUNT [ZONE] [--json]` (argv after
 * "account timezone"): shows, or sets and shows, the account's time zone. */
int admin_account_timezone(PGconn *db, int argc, char **argv);
