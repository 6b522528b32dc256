/* migrate.h — versioned schema migrations.
 *
 * Migrations are files named NNN_name.sql in one folder, applied in number
 * order, each in its own transaction together with its row in
 * schema_migrations, under an advisory lock so two migrators never race.
 * Applying twice is a no-op. A database that has a migration this tally does
 * not know is refused: old code must not write to a newer schema. */
#pragma once

#include <libpq-fe.h>
#include <stddef.h>

#define MIGRATION_NAME_MAX 128

struct migration {
        int version;
        char name[MIGRATION_NAME_MAX]; /* file name, e.g. "001_core.sql" */
};

/* Lists dir's migrations sorted by version into *ret (caller frees).
 * Refuses duplicates and badly named .sql files. Returns the count or -errno. */
int migrations_list(const char *dir, struct migration **ret, char *err, size_t errlen);

/* Applies every migration of dir the database lacks. *ret_applied, if given,
 * receives how many were applied. Returns 0, or -errno with the reason in err
 * (-EPROTO for a database newer than dir). */
int migrations_apply(PGconn *conn, const char *dir, int *ret_applied, char *err, size_t errlen);
