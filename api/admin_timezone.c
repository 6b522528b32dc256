/* admin_timezone.c — `tally-admin account timezone ACCOUNT [ZONE] [--json]`:
 * shows an account's time zone (and today's day in it), or sets it as a
 * person does through PUT /v1/account/settings: the same SQL function
 * (account_set_time_zone, sql/017), validated, the account's days rebuilt,
 * audited as 'admin'. */
#include "admin.h"
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int admin_account_timezone(PGconn *db, int argc, char **argv)
{
        const char *account = NULL, *zone = NULL;
        bool as_json = false;
        for (int i = 0; i < argc; i++) {
                if (strcmp(argv[i], "--json") == 0)
                        as_json = true;
                else if (argv[i][0] == '-') {
                        fprintf(stderr, "tally-admin: account timezone: unknown option %s (see account --help)\n",
                                argv[i]);
                        return -EINVAL;
                } else if (!account)
                        account = argv[i];
                else if (!zone)
                        zone = argv[i];
                else {
                        fprintf(stderr, "tally-admin: account timezone takes ACCOUNT and at most one ZONE\n");
                        return -EINVAL;
                }
        }
        if (!account) {
                fprintf(stderr, "tally-admin: account timezone needs an ACCOUNT\n");
                return -EINVAL;
        }
        struct api_error err = { 0 };
        char old[64] = "";
        if (zone && account_time_zone_set(db, account, zone, "admin", old, &err) < 0) {
                fprintf(stderr, "tally-admin: could not set the time zone: %s\n", err.message);
                return err.status == 404 ? -ENOENT : -EDOM; /* said above: not "unknown command" */
        }
        json_t *s = NULL;
        if (account_settings_read(db, account, &s, &err) < 0) {
                fprintf(stderr, "tally-admin: %s\n", err.message);
                return err.status == 404 ? -ENOENT : -EIO;
        }
        if (zone)
                json_object_set_new(s, "previous_time_zone", json_string(old));
        if (as_json) {
                char *text = json_dumps(s, JSON_SORT_KEYS);
                if (text)
                        printf("%s\n", text);
                free(text);
        } else {
                printf("account=%s time_zone=%s", json_string_value(json_object_get(s, "account")),
                       json_string_value(json_object_get(s, "time_zone")));
                if (zone)
                        printf(" previous_time_zone=%s", old);
                printf(" utc_offset=%s today=%s day_start=%s day_end=%s day_hours=%lld\n",
                       json_string_value(json_object_get(s, "utc_offset")),
                       json_string_value(json_object_get(s, "day")), json_string_value(json_object_get(s, "day_start")),
                       json_string_value(json_object_get(s, "day_end")),
                       (long long)json_integer_value(json_object_get(s, "day_hours")));
        }
        json_decref(s);
        return 0;
}
