/* admin.h — tally-admin's insides shared between its files: admin.c (the
 * program: accounts, people, keys, months) hands its terminal views to
 * admin_status.c, which hands `invoice` and usage per sandbox or label to
 * admin_finance.c. */
#pragma once

#include <libpq-fe.h>
#include <stdbool.h>

/* Runs `status`, `spend`, `usage`, `key list` or `invoice` (argv[0]) on db.
 * Returns 0 or a negative errno (said on stderr); -ENOSYS when argv[0] is
 * none of them. */
int admin_view(PGconn *db, int argc, char **argv);

/* admin_timezone.c: `account timezone ACCOUNT [ZONE] [--json]` (argv after
 * "account timezone"): shows, or sets and shows, the account's time zone. */
int admin_account_timezone(PGconn *db, int argc, char **argv);

/* admin_hosts.c: `host list [--json]`, `host drain|resume HOST_ID [--json]`,
 * `host forget HOST_ID` (argv after "host"): the host registry (sql/021).
 * -ENOENT for a host it does not hold; -EINVAL for no such verb. */
int admin_host(PGconn *db, int argc, char **argv);

/* nano-dollars (bigint or numeric SQL expression) → SQL text "$1.234567" (half
 * away from zero, micro-dollars): how the terminal views show money. */
#define DOLLARS(x) "'$' || to_char(round((" x ")::numeric / 1000000000, 6), 'FM999999990.000000')"

/* admin_status.c's helpers for the other views. */
/* Runs sql, saying on stderr what it waits for after a second; the result
 * (the caller's to PQclear) or NULL (said on stderr). */
PGresult *admin_query(PGconn *db, const char *what, const char *sql, int n, const char *const *params);
/* Prints every row of res as a table that fits the terminal, or with json as
 * one JSON array of objects keyed by the heads (values as text, null for
 * none). heads name the columns; a leading '>' right-aligns one. */
void admin_print(PGresult *res, const char *const *heads, bool json);
/* Prints nrows rows of ncols cells (row after row; NULL shows "—") as a table. */
void admin_table(int ncols, const char *const *heads, const char *const *cells, int nrows);

/* admin_finance.c */
/* tally-admin invoice [--month YYYY-MM] [--account ID] [--json]: argv[0] is "invoice". */
int admin_invoice(PGconn *db, int argc, char **argv);
/* tally-admin usage --by sandbox|label:NAME: usage and cost per sandbox, or
 * per value of one label, over whole days [from, to) of each account (its time zone) (NULL: from the 1st
 * of this month, to tomorrow), of one account or all (NULL). */
int admin_usage_sandboxes(PGconn *db, const char *account, const char *from, const char *to, const char *by,
                          bool json);
