#!/usr/bin/env python3
# api/openapi.py OUT.json OUT.c — writes tally-api's OpenAPI 3.1 document
# (every route the server answers; docs/api.md describes them in prose) as
# JSON, and as a C file defining api_openapi_json() that returns it. Run by
# meson at build time; the document is data, so it lives here rather than in
# a C string written by hand.
import json
import sys


def ref(name):
    return {"$ref": "#/components/schemas/" + name}


def resp(desc, schema=None, ctype="application/json"):
    r = {"description": desc}
    if schema is not None:
        r["content"] = {ctype: {"schema": schema}}
    return r


ERRORS = {
    "400": {"$ref": "#/components/responses/BadRequest"},
    "401": {"$ref": "#/components/responses/Unauthorized"},
    "405": {"$ref": "#/components/responses/MethodNotAllowed"},
    "414": {"$ref": "#/components/responses/UriTooLong"},
    "429": {"$ref": "#/components/responses/TooManyRequests"},
    "431": {"$ref": "#/components/responses/HeadersTooLarge"},
    "500": {"$ref": "#/components/responses/Internal"},
    "503": {"$ref": "#/components/responses/Unavailable"},
}


def errors(*codes):
    out = {c: ERRORS[c] for c in ("400", "401", "405", "414", "429", "431", "500", "503")}
    for c in codes:
        out[c] = {"$ref": "#/components/responses/" + {
            "402": "OverLimit", "403": "Forbidden", "404": "NotFound", "409": "Conflict",
            "413": "TooLarge", "422": "Unprocessable", "507": "NoCapacity"}[c]}
    return out


def qparam(name, desc, schema, required=False):
    return {"name": name, "in": "query", "required": required, "description": desc, "schema": schema}


ID = {"name": "id", "in": "path", "required": True, "schema": ref("Id")}
IDEM = {"name": "Idempotency-Key", "in": "header", "required": False,
        "description": "Makes a write safe to retry: the first answer is stored and replayed for 24 hours, "
                       "to the same API key (or person) on the same route only; the same key there with another path "
                       "or body gets 422; a retry while the first runs waits or gets 409. An answer that showed a "
                       "secret once is replayed without it (the field null, secret_shown_once true).",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255}}
CURSOR = qparam("cursor", "The next_cursor of the previous page (opaque).", {"type": "string"})
LIMIT = qparam("limit", "Rows per page (default 100).", {"type": "integer", "minimum": 1, "maximum": 1000})
ANY = [{"apiKey": []}, {"session": []}]
PERSON = [{"session": []}]
KEY = [{"apiKey": []}]


def op(summary, security, responses, params=None, body=None, opid=None, desc=None):
    o = {"operationId": opid, "summary": summary, "responses": responses}
    if desc:
        o["description"] = desc
    if security is not None:
        o["security"] = security
    if params:
        o["parameters"] = params
    if body is not None:
        o["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return o


def write(summary, security, ok, params=None, body=None, opid=None, extra=(), desc=None):
    return op(summary, security, dict(ok, **errors("404", "409", "413", "422", *extra)),
              [IDEM] + (params or []), body, opid, desc)


paths = {
    "/": {"get": op("The billing dashboard (web/index.html): a person signs in and it reads /v1 with the session.", [],
                    {"200": resp("The page", {"type": "string"}, "text/html")}, opid="getDashboard")},
    "/static/{id}": {"parameters": [ID], "get": op(
        "A file of the dashboard (web/): its script and style, and the chart library npm installed.", [],
        {"200": resp("The file", {"type": "string"}, "application/octet-stream"),
         "404": {"$ref": "#/components/responses/NotFound"}}, opid="getDashboardFile")},
    "/healthz": {"get": op("Liveness: the server answers and reaches PostgreSQL; each tally-vmm host as the watch last saw it (status degraded while one is down).", [],
                           {"200": resp("Healthy", {"type": "object"}), "503": resp("Unhealthy", ref("Error"))},
                           opid="getHealthz")},
    "/metrics": {"get": op("Prometheus text: requests by route and status, latency histogram, pool use.", [],
                           {"200": resp("Metrics", {"type": "string"}, "text/plain; version=0.0.4")},
                           opid="getMetrics")},
    "/v1/openapi.json": {"get": op("This document.", [], {"200": resp("OpenAPI 3.1", {"type": "object"})},
                                   opid="getOpenapi")},
    "/v1/sessions": {"post": op(
        "Sign in a person with email and password: sets the session cookie and returns the CSRF token.", [],
        dict({"201": resp("Signed in", ref("Session"))}, **errors("413")),
        body=ref("SignIn"), opid="createSession",
        desc="Attempts are counted per email and per client address (an IPv6 client by its /64) before the "
             "password is checked; past signin_max_failures in signin_window_s, 429 with Retry-After, even "
             "with the right password.")},
    "/v1/sessions/current": {
        "get": op("The signed-in person.", PERSON, dict({"200": resp("Session", ref("Session"))}, **errors("403")),
                  opid="getSession"),
        "delete": op("Sign out: the session ends and its cookie is cleared.", PERSON,
                     dict({"204": resp("Signed out")}, **errors("403")), [IDEM], opid="deleteSession"),
    },
    "/v1/keys": {
        "get": op("List the account's API keys (person only).", PERSON,
                  dict({"200": resp("A page of keys", ref("KeyPage"))}, **errors("403")), [CURSOR, LIMIT],
                  opid="listKeys"),
        "post": write("Create an API key (person only); the secret is shown once.", PERSON,
                      {"201": resp("Created", ref("KeyCreated"))}, body=ref("KeyCreate"), opid="createKey",
                      extra=("403",)),
    },
    "/v1/keys/{id}": {
        "get": op("One API key (person only).", PERSON, dict({"200": resp("Key", ref("Key"))}, **errors("403", "404")),
                  [ID], opid="getKey"),
        "delete": write("Revoke an API key (person only); it gets 401 afterwards.", PERSON,
                        {"200": resp("Revoked", ref("Key"))}, [ID], opid="revokeKey", extra=("403",)),
    },
    "/v1/keys/{id}/limit": {
        "put": write("Set, raise or lower a key's daily limit and its policy (person only; never an API key).",
                     PERSON, {"200": resp("Key", ref("Key"))}, [ID], ref("LimitSet"), opid="setKeyLimit",
                     extra=("403",),
                     desc="Raising the limit above today's spend lifts today's block; paused sandboxes stay paused."),
        "delete": write("Remove a key's daily limit (person only).", PERSON, {"200": resp("Key", ref("Key"))}, [ID],
                        opid="deleteKeyLimit", extra=("403",)),
    },
    "/v1/keys/{id}/caps": {
        "get": op("A key's caps (person only).", PERSON,
                  dict({"200": resp("Caps", ref("KeyCaps"))}, **errors("403", "404")), [ID], opid="getKeyCaps"),
        "put": write("Set a key's caps on what it may hold at once (person only; never an API key).", PERSON,
                     {"200": resp("Caps", ref("KeyCaps"))}, [ID], ref("KeyCapsSet"), opid="setKeyCaps",
                     extra=("403",),
                     desc="max_sandboxes: its sandboxes not stopped; max_memory_mib: their memory summed. null: no "
                          "cap. Creates and forks past a cap get 409 cap_reached; sandboxes already running stay."),
    },
    "/v1/keys/{id}/internet": {
        "put": write("Allow or refuse internet to the sandboxes a key creates or forks (person only; never an API "
                     "key). Off for every new key.", PERSON, {"200": resp("Key", ref("Key"))}, [ID],
                     ref("InternetSet"), opid="setKeyInternet", extra=("403",),
                     desc="Without it, a create or fork asking for internet is refused with 403 internet_not_allowed."),
    },
    "/v1/sandboxes": {
        "get": op("List sandboxes (an API key sees those it created).", ANY,
                  dict({"200": resp("A page of sandboxes", ref("SandboxPage"))}, **errors()),
                  [qparam("state", "Filter by state (several: comma-separated).", {"type": "string"}),
                   qparam("label", "Filter by label, NAME=VALUE (several: comma-separated).", {"type": "string"}),
                   CURSOR, LIMIT], opid="listSandboxes"),
        "post": write("Create a sandbox for the calling key (402 while the key is over its daily limit, 403 "
                      "internet_not_allowed when it asks for internet and its key may not, 409 past its caps, 507 "
                      "when the host has no room).", KEY,
                      {"201": resp("Created", ref("Sandbox"))}, body=ref("SandboxCreate"), opid="createSandbox",
                      extra=("402", "403", "507")),
    },
    "/v1/sandboxes/{id}": {
        "get": op("One sandbox, with its cost so far.", ANY,
                  dict({"200": resp("Sandbox", ref("Sandbox"))}, **errors("404")), [ID], opid="getSandbox"),
        "delete": write("Stop and delete a sandbox.", ANY, {"200": resp("Stopped", ref("Sandbox"))}, [ID],
                        opid="deleteSandbox"),
    },
    "/v1/sandboxes/{id}/exec": {"post": write(
        "Run a command in a sandbox (402 while the sandbox's key or the calling key is over its daily limit).", ANY,
        {"200": resp("Its result", {"type": "object"})}, [ID], {"type": "object"}, opid="execSandbox",
        extra=("402",),
        desc="Runs on one of tally-api's workers: a key runs workers_per_key sandbox requests at once and its "
             "account workers_per_account; more wait, and past queue_per_account waiting the answer is 429.")},
    "/v1/sandboxes/{id}/pause": {"post": write("Pause a sandbox.", ANY, {"200": resp("Paused", ref("Sandbox"))},
                                               [ID], None, opid="pauseSandbox")},
    "/v1/sandboxes/{id}/resume": {"post": write("Resume a sandbox (402 while its key is over its daily limit).",
                                                ANY, {"200": resp("Running", ref("Sandbox"))}, [ID], None,
                                                opid="resumeSandbox", extra=("402",))},
    "/v1/sandboxes/{id}/fork": {"post": write("Fork a sandbox into a new one (the copies keep its network; 403 "
                                              "internet_not_allowed if it has internet and its key no longer may, "
                                              "409 past its key's caps, 507 when the host has no room).", ANY,
                                              {"201": resp("The copy", ref("Sandbox"))}, [ID], None,
                                              opid="forkSandbox", extra=("402", "403", "507"))},
    "/v1/sandboxes/{id}/timeout": {"post": write(
        "Set a sandbox's timeout (402 while the sandbox's key or the calling key is over its daily limit).", ANY,
        {"200": resp("Sandbox", ref("Sandbox"))}, [ID], {"type": "object"}, opid="setSandboxTimeout",
        extra=("402",))},
    "/v1/usage": {"get": op(
        "Usage and its cost per period, grouped, rated as docs/billing.md says.", ANY,
        dict({"200": {"description": "A page of rows (JSON), or every row (CSV: Accept: text/csv or csv=true)",
                      "content": {"application/json": {"schema": ref("UsagePage")},
                                  "text/csv": {"schema": {
                                      "type": "string",
                                      "description": "RFC 4180 with a header row: period_start, period_end, one "
                                                     "column per group_by dimension in the order asked, meter, unit, "
                                                     "quantity, quantity_base, base_unit, cost_nanodollars, "
                                                     "cost_cents. No cursor or limit: more than 100,000 rows is a 422."}}}}},
             **errors("422")),
        [qparam("from", "Start (inclusive), RFC 3339, on a whole UTC hour.", {"type": "string", "format": "date-time"}, True),
         qparam("to", "End (exclusive), RFC 3339, on a whole UTC hour; after from, at most 366 days later.",
                {"type": "string", "format": "date-time"}, True),
         qparam("granularity", "Period of a row (UTC).", {"type": "string", "enum": ["hour", "day", "month"], "default": "day"}),
         qparam("group_by", "Comma-separated dimensions: key, sandbox, label:NAME (at most 4), e.g. key,label:agent.",
                {"type": "string"}),
         qparam("meter", "Comma-separated meters (default all): cpu, memory, storage.", {"type": "string"}),
         qparam("csv", "true: answer text/csv, as Accept: text/csv does.", {"type": "boolean", "default": False}),
         CURSOR, LIMIT], opid="getUsage",
        desc="A person sees the account; an API key sees the usage of sandboxes it created. Each row is one "
             "(period, group, meter): its exact sum of quantity x rate in force per hour, divided once and rounded "
             "once half away from zero to nano-dollars and to cents.")},
    "/v1/spend": {"get": op(
        "Today's spend per key (the account's day, in its time zone) against its daily limit, the burn rate and when "
        "the limit is reached at that rate.",
        ANY, dict({"200": resp("A page of keys", ref("SpendPage"))}, **errors()),
        [qparam("day", "Another day of the account (its time zone) than today: its spend, limit state and block; "
                       "burn rate 0 and reaches_limit_at null.", {"type": "string", "format": "date"}),
         CURSOR, LIMIT], opid="getSpend",
        desc="day, day_start and day_end: the account's day (time_zone) and the instants it starts and ends, 23 or 25 "
             "hours apart on a change of daylight saving time. "
             "burn_rate_nanodollars_per_hour: the key's spend from its burn_window_start (a reference point "
             "between rate_window and twice that old) to its last spend change, per hour; 0 once spend has not "
             "changed for rate_window. reaches_limit_at: the last spend change + ceil(remaining x window / spend "
             "in the window) microseconds, the instant the spend.limit_projected alert records (sql/016 "
             "spend_projection_of). The answer's burn_window_start is always null (each key has its own).")},
    "/v1/alerts": {"get": op(
        "Spend alerts (50, 80, 100 % of a key's daily limit) with their delivery state, newest first.", ANY,
        dict({"200": resp("A page of alerts", ref("AlertPage"))}, **errors()),
        [qparam("key", "Only this key's alerts.", ref("Id")),
         qparam("state", "Only pending, delivered, failed or no_destination alerts.",
                {"type": "string", "enum": ["pending", "delivered", "failed", "no_destination"]}),
         CURSOR, LIMIT], opid="listAlerts",
        desc="type spend.limit_projected is the warning before the limit (threshold_pct null). state: delivered "
             "once any destination got the event, no_destination when the account had no enabled destination, failed "
             "when every delivery failed, else pending. A person's "
             "session also sees each alert's deliveries (docs/alerts.md).")},
    "/v1/account/settings": {
        "get": op("The account's settings: its time zone, today's date in it and the instants today starts and ends.",
                  ANY, dict({"200": resp("Settings", ref("AccountSettings"))}, **errors("404")),
                  opid="getAccountSettings"),
        "put": write("Set the account's time zone (person only; never an API key): its daily limits, spend days, "
                     "alerts and invoice months follow it.", PERSON, {"200": resp("Settings", ref("AccountSettings"))},
                     None, ref("AccountSettingsSet"), opid="setAccountSettings", extra=("403",),
                     desc="An IANA zone name PostgreSQL knows (pg_timezone_names), else 400. The account's days are "
                          "recomputed from its hours at once; today's blocks follow the new day. Audited."),
    },
    "/v1/alert-destinations": {
        "get": op("Where the account's alerts go (secrets are never shown again).", PERSON,
                  dict({"200": resp("The destinations", ref("DestinationList"))}, **errors("403")),
                  opid="listAlertDestinations"),
        "post": write("Adds a webhook (its signing secret is in this answer only) or an email destination.", PERSON,
                      {"201": resp("Created", ref("DestinationCreated"))}, body=ref("DestinationCreate"),
                      opid="createAlertDestination", extra=("403",))},
    "/v1/alert-destinations/{id}": {"delete": write(
        "Disables a destination; its pending deliveries fail.", PERSON,
        {"200": resp("Disabled", ref("Destination"))}, [ID], opid="disableAlertDestination", extra=("403",))},
    "/v1/alert-destinations/{id}/test": {"post": write(
        "Queues a test event (type \"test\") to an enabled destination.", PERSON,
        {"202": resp("Queued", ref("DeliveryQueued"))}, [ID], opid="testAlertDestination", extra=("403",))},
    "/v1/alert-deliveries": {"get": op(
        "The account's alert deliveries, newest first: each one's destination, event, state, attempts and last "
        "error, test events and resends included.", PERSON,
        dict({"200": resp("A page of deliveries", ref("DeliveryPage"))}, **errors("403")),
        [qparam("destination", "Only this destination's deliveries.", ref("Id")), CURSOR, LIMIT],
        opid="listAlertDeliveries")},
    "/v1/alert-deliveries/{id}/resend": {"post": write(
        "Sends a delivered or failed delivery's event again: a new delivery with the same event id.", PERSON,
        {"202": resp("Queued", ref("DeliveryQueued"))},
        [{"name": "id", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"}}],
        opid="resendAlertDelivery", extra=("403",))},
}

nullable_int = {"type": ["integer", "null"]}
nullable_str = {"type": ["string", "null"]}
schemas = {
    "Id": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,64}$"},
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message", "field"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                       "field": {"type": "string", "description": "The field at fault, \"\" if none."}}}}},
    "SignIn": {"type": "object", "additionalProperties": False, "required": ["email", "password"],
               "properties": {"email": {"type": "string", "maxLength": 254},
                              "password": {"type": "string", "maxLength": 1024}}},
    "Session": {"type": "object", "properties": {"person": {"type": "string"}, "account": {"type": "string"},
                                                 "email": {"type": "string"}, "csrf_token": {"type": "string"}}},
    "Key": {"type": "object", "properties": {
        "id": ref("Id"), "name": {"type": "string"}, "prefix": {"type": "string"},
        "daily_limit_nanodollars": nullable_int,
        "limit_policy": {"type": "string", "enum": ["pause", "stop", "alert_only"]},
        "created_at": {"type": "string", "format": "date-time"}, "revoked_at": nullable_str,
        "internet": {"type": "boolean", "description": "Whether its sandboxes may ask for internet (a person sets it)."},
        "max_sandboxes": nullable_int, "max_memory_mib": nullable_int}},
    "InternetSet": {"type": "object", "additionalProperties": False, "required": ["internet"],
                    "properties": {"internet": {"type": "boolean"}}},
    "Network": {"description": "false: loopback only (the default); true: internet through the host's egress proxy, "
                               "any name; an object: internet limited to the names of allow.",
                "oneOf": [{"type": "boolean"}, {
                    "type": "object", "additionalProperties": False, "properties": {
                        "internet": {"type": "boolean"},
                        "allow": {"type": "array", "maxItems": 64, "items": {
                            "type": "string", "maxLength": 253,
                            "description": "A DNS name; a leading \"*.\" matches every name below it."}}}}]},
    "KeyCreated": {"allOf": [ref("Key"), {"type": "object", "properties": {
        "key": {"type": ["string", "null"],
                "description": "The secret, tk_..., shown once: null in an Idempotency-Key replay."},
        "secret_shown_once": {"type": "boolean",
                              "description": "In an Idempotency-Key replay: the secret was shown once, "
                                             "in the first answer, and is kept nowhere."}}}]},
    "KeyCreate": {"type": "object", "additionalProperties": False, "properties": {
        "name": {"type": "string"}, "daily_limit_nanodollars": nullable_int,
        "limit_policy": {"type": "string", "enum": ["pause", "stop", "alert_only"]}}},
    "KeyPage": {"type": "object", "properties": {"data": {"type": "array", "items": ref("Key")},
                                                 "next_cursor": nullable_str}},
    "KeyCaps": {"type": "object", "properties": {"id": ref("Id"), "max_sandboxes": nullable_int,
                                                 "max_memory_mib": nullable_int}},
    "KeyCapsSet": {"type": "object", "additionalProperties": False,
                   "properties": {"max_sandboxes": nullable_int, "max_memory_mib": nullable_int}},
    "LimitSet": {"type": "object", "additionalProperties": False, "required": ["daily_limit_nanodollars"],
                 "properties": {"daily_limit_nanodollars": nullable_int,
                                "limit_policy": {"type": "string", "enum": ["pause", "stop", "alert_only"]}}},
    "Sandbox": {"type": "object", "properties": {
        "id": ref("Id"), "key": ref("Id"), "state": {"type": "string", "enum": ["running", "paused", "stopped"]},
        "vcpus": {"type": "integer"}, "mem_size_bytes": {"type": "integer"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "cost_nanodollars": {"type": "integer"}, "network": ref("Network"),
        "net_rx_bytes": {"type": "integer", "description": "Bytes its egress proxy relayed to it (recorded, not priced)."},
        "net_tx_bytes": {"type": "integer", "description": "Bytes its egress proxy relayed from it."},
        "mem_bytes": {"type": "integer",
                      "description": "Memory its cgroup is charged now, measured by its host's kernel (not priced: "
                                     "memory is billed by its size). Absent once stopped."},
        "mem_peak_bytes": {"type": "integer",
                           "description": "The most memory its cgroup was charged since it was made. Absent once "
                                          "stopped, or where the host's kernel keeps no peak."}}},
    "SandboxCreate": {"type": "object", "additionalProperties": False, "properties": {
        "vcpus": {"type": "integer"}, "mem_size_bytes": {"type": "integer"}, "disk_size_bytes": {"type": "integer"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}}, "timeout_s": {"type": "integer"},
        "network": ref("Network")}},
    "SandboxPage": {"type": "object", "properties": {"data": {"type": "array", "items": ref("Sandbox")},
                                                     "next_cursor": nullable_str}},
    "UsageRow": {"type": "object", "required": ["period_start", "period_end", "group", "meter", "unit", "quantity",
                                                "quantity_base", "base_unit", "cost_nanodollars", "cost_cents"],
                 "properties": {
                     "period_start": {"type": "string", "format": "date-time",
                                      "description": "The period's start, or from if later."},
                     "period_end": {"type": "string", "format": "date-time",
                                    "description": "The period's end, or to if earlier (exclusive)."},
                     "group": {"type": "object", "additionalProperties": nullable_str,
                               "description": "One member per group_by dimension; null: the sandbox has no such label."},
                     "meter": {"type": "string", "enum": ["cpu", "memory", "storage"]},
                     "unit": {"type": "string", "enum": ["vCPU-hour", "GiB-hour", "GB-month"]},
                     "quantity": {"type": "string", "pattern": "^[0-9]+\\.[0-9]{9}$",
                                  "description": "In billing units, rounded half away from zero to 9 decimals."},
                     "quantity_base": {"type": "string", "pattern": "^[0-9]+$",
                                       "description": "Exact, in base units (cpu-ns or byte-ns)."},
                     "base_unit": {"type": "string", "enum": ["cpu-ns", "byte-ns"]},
                     "cost_nanodollars": {"type": "integer"}, "cost_cents": {"type": "integer"}}},
    "UsagePage": {"type": "object", "properties": {
        "from": {"type": "string"}, "to": {"type": "string"}, "granularity": {"type": "string"},
        "group_by": {"type": "array", "items": {"type": "string"}},
        "data": {"type": "array", "items": ref("UsageRow")}, "next_cursor": nullable_str}},
    "SpendKey": {"type": "object", "properties": {
        "key": ref("Id"), "name": {"type": "string"}, "revoked": {"type": "boolean"},
        "spend_nanodollars": {"type": "integer"}, "spend_cents": {"type": "integer"},
        "limit_nanodollars": nullable_int, "limit_policy": {"type": "string"},
        "remaining_nanodollars": nullable_int, "limit_reached": {"type": "boolean"}, "blocked": {"type": "boolean"},
        "burn_rate_nanodollars_per_hour": {"type": "integer"},
        "burn_window_start": {"type": ["string", "null"], "format": "date-time"},
        "reaches_limit_at": {"type": ["string", "null"], "format": "date-time"}}},
    "AccountSettings": {"type": "object", "properties": {
        "account": ref("Id"), "time_zone": {"type": "string"}, "day": {"type": "string", "format": "date"},
        "day_start": {"type": "string", "format": "date-time"}, "day_end": {"type": "string", "format": "date-time"},
        "day_hours": {"type": "integer"}, "utc_offset": {"type": "string"}}},
    "AccountSettingsSet": {"type": "object", "additionalProperties": False, "required": ["time_zone"],
                           "properties": {"time_zone": {"type": "string", "minLength": 1, "maxLength": 63}}},
    "SpendPage": {"type": "object", "properties": {
        "day": nullable_str, "as_of": nullable_str, "burn_window_start": nullable_str,
        "time_zone": nullable_str, "today": {"type": ["boolean", "null"]}, "day_start": nullable_str,
        "day_end": nullable_str,
        "data": {"type": "array", "items": ref("SpendKey")}, "next_cursor": nullable_str}},
    "Alert": {"type": "object", "properties": {
        "id": {"type": "integer"}, "event_id": {"type": "string", "format": "uuid"},
        "type": {"type": "string", "enum": ["spend.threshold_reached", "spend.limit_projected"]},
        "key": ref("Id"), "day": {"type": "string", "format": "date"},
        "threshold_pct": {"type": ["integer", "null"], "enum": [50, 80, 100, None]},
        "spend_nanodollars": {"type": "integer"},
        "limit_nanodollars": {"type": "integer"}, "created_at": {"type": "string", "format": "date-time"},
        "projected_at": {"type": ["string", "null"], "format": "date-time"},
        "state": {"type": "string", "enum": ["pending", "delivered", "failed", "no_destination"]},
        "delivered_at": {"type": ["string", "null"], "format": "date-time"},
        "deliveries": {"type": "array", "items": ref("Delivery"), "description": "A person's session only."}}},
    "Delivery": {"type": "object", "properties": {
        "id": {"type": "integer"}, "destination": ref("Id"),
        "state": {"type": "string", "enum": ["pending", "delivered", "failed"]},
        "attempts": {"type": "integer"}, "last_error": nullable_str,
        "next_attempt_at": {"type": "string", "format": "date-time"},
        "delivered_at": {"type": ["string", "null"], "format": "date-time"}, "resend_of": nullable_int}},
    "DestinationCreate": {"type": "object", "additionalProperties": False, "required": ["kind"], "properties": {
        "kind": {"type": "string", "enum": ["webhook", "email"]},
        "url": {"type": "string", "maxLength": 2048, "description": "webhook: https:// (or operator-allowed http://)"},
        "email": {"type": "string", "maxLength": 254}}},
    "Destination": {"type": "object", "properties": {
        "id": ref("Id"), "kind": {"type": "string", "enum": ["webhook", "email"]}, "url": nullable_str,
        "email": nullable_str, "enabled": {"type": "boolean"}, "created_at": {"type": "string", "format": "date-time"},
        "disabled_at": nullable_str}},
    "DestinationCreated": {"allOf": [ref("Destination"), {"type": "object", "properties": {
        "secret": {"type": ["string", "null"], "description": "The webhook's signing secret, shown only here."}}}]},
    "DestinationList": {"type": "object", "properties": {"destinations": {"type": "array",
                                                                          "items": ref("Destination")}}},
    "DeliveryQueued": {"type": "object", "properties": {
        "delivery_id": {"type": "integer"}, "event_id": {"type": "string"}, "destination": ref("Id"),
        "state": {"type": "string", "enum": ["pending"]}}},
    "DeliveryRecord": {"type": "object", "properties": {
        "id": {"type": "integer"}, "destination": ref("Id"), "destination_enabled": {"type": "boolean"},
        "event_id": {"type": "string", "format": "uuid"},
        "type": {"type": "string", "enum": ["spend.threshold_reached", "spend.limit_projected", "test"]},
        "alert_id": nullable_int, "state": {"type": "string", "enum": ["pending", "delivered", "failed"]},
        "attempts": {"type": "integer"}, "last_error": nullable_str,
        "created_at": {"type": "string", "format": "date-time"},
        "next_attempt_at": {"type": ["string", "null"], "format": "date-time", "description": "While pending."},
        "delivered_at": {"type": ["string", "null"], "format": "date-time"}, "resend_of": nullable_int,
        "requested_by": {"type": ["string", "null"], "description": "person:<id> for a test event or a resend."}}},
    "DeliveryPage": {"type": "object", "properties": {"data": {"type": "array", "items": ref("DeliveryRecord")},
                                                      "next_cursor": nullable_str}},
    "AlertPage": {"type": "object", "properties": {"data": {"type": "array", "items": ref("Alert")},
                                                   "next_cursor": nullable_str}},
}


# Invoices (api/invoices.c, docs/finance.md "The same rows over HTTP"): a person's view of the account's monthly invoices.
MONTH = {"name": "id", "in": "path", "required": True, "description": "The month, YYYY-MM (UTC).",
         "schema": {"type": "string", "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])$"}}
INVOICE_CSV = {"type": "string", "description": "RFC 4180, one row per line: month, status, line_no, kind, meter, "
               "for_month, quantity, unit, quantity_base, base_unit, amount_nanodollars, amount_cents."}


CSV_PARAM = qparam("csv", "true: the lines as CSV, as Accept: text/csv asks (for a plain link).",
                   {"type": "boolean"})


def invoice_resp(desc, schema):
    return {"description": desc, "content": {"application/json": {"schema": schema},
                                             "text/csv": {"schema": INVOICE_CSV}}}


paths.update({
    "/v1/invoices": {"get": op(
        "The account's invoices, newest first: closed months, and previews of the open ones. "
        "With Accept: text/csv, every line of them.", PERSON,
        dict({"200": invoice_resp("Invoices", ref("InvoiceList"))}, **errors()), [CSV_PARAM],
        opid="listInvoices")},
    "/v1/invoices/current": {"get": op(
        "This UTC month's invoice as it would be if closed now (status preview), with its end-of-month "
        "projection at the month's rate so far (status estimate).", PERSON,
        dict({"200": invoice_resp("The current month", ref("Invoice"))}, **errors()), [CSV_PARAM],
        opid="getCurrentInvoice")},
    "/v1/invoices/{id}": {"get": op(
        "One month's invoice with its lines and per-key breakdown (closed, or a preview while open).", PERSON,
        dict({"200": invoice_resp("The invoice", ref("Invoice"))}, **errors("404")), [MONTH, CSV_PARAM],
        opid="getInvoice")},
})
schemas.update({
    "InvoiceLine": {"type": "object", "properties": {
        "line_no": {"type": "integer"}, "kind": {"type": "string", "enum": ["usage", "credit", "adjustment"]},
        "meter": {"type": "string", "enum": ["cpu", "memory", "storage", "credit"]},
        "for_month": {"type": "string", "description": "The month the usage happened in (YYYY-MM)."},
        "quantity": {"type": "string", "description": "In unit, exact decimal to 12 places."},
        "unit": {"type": "string", "enum": ["vCPU-hour", "GiB-hour", "GB-month", "sandbox-hour"]},
        "quantity_base": {"type": "string", "description": "Exact, in base_unit."},
        "base_unit": {"type": "string", "enum": ["CPU-ns", "byte-ns", "running-ns"]},
        "amount_nanodollars": {"type": "integer"}, "amount_cents": {"type": "integer"}}},
    "InvoiceKeyLine": {"type": "object", "properties": {
        "key": ref("Id"), "kind": {"type": "string", "enum": ["usage", "adjustment"]},
        "meter": {"type": "string"}, "for_month": {"type": "string"}, "quantity": {"type": "string"},
        "unit": {"type": "string"}, "amount_nanodollars": {"type": "integer"}, "amount_cents": {"type": "integer"}}},
    "Invoice": {"type": "object", "properties": {
        "account": ref("Id"), "month": {"type": "string"},
        "status": {"type": "string", "enum": ["closed", "preview", "estimate"]},
        "period_start": {"type": "string", "format": "date-time"},
        "period_end": {"type": "string", "format": "date-time"}, "currency": {"type": "string"},
        "total_nanodollars": {"type": "integer", "description": "The sum of the lines' amount_nanodollars."},
        "total_cents": {"type": "integer", "description": "The sum of the lines' amount_cents."},
        "line_count": {"type": "integer"}, "closed_at": {"type": ["string", "null"], "format": "date-time"},
        "lines": {"type": "array", "items": ref("InvoiceLine")},
        "keys": {"type": "array", "items": ref("InvoiceKeyLine")},
        "projection": {"description": "GET /v1/invoices/current only: the end-of-month estimate, or null.",
                       "oneOf": [{"type": "null"}, {"type": "object"}]}}},
    "InvoiceList": {"type": "object", "properties": {"account": ref("Id"),
                                                     "data": {"type": "array", "items": ref("Invoice")}}},
})


def err_resp(desc):
    return {"description": desc, "content": {"application/json": {"schema": ref("Error")}}}


doc = {
    "openapi": "3.1.0",
    "info": {"title": "tally API", "version": "1",
             "description": "Usage, spend, limits, keys and sandboxes of tally. Errors are "
                            "{\"error\": {\"code\", \"message\", \"field\"}}, whatever the status. A query "
                            "parameter a route does not know, or one holding a NUL or invalid UTF-8, is a 400. "
                            "Money is integer nano-dollars (1e-9 USD)."},
    "servers": [{"url": "/"}],
    "security": ANY,
    "paths": paths,
    "components": {
        "securitySchemes": {
            "apiKey": {"type": "http", "scheme": "bearer", "description": "An API key, tk_..."},
            "session": {"type": "apiKey", "in": "cookie", "name": "tally_session",
                        "description": "A person's session; writes also need the X-CSRF-Token header."},
        },
        "schemas": schemas,
        "responses": {
            "BadRequest": err_resp("Bad input; error.field names the field at fault."),
            "Unauthorized": err_resp("No valid API key or session."),
            "OverLimit": err_resp("The key is over its daily spend limit today."),
            "Forbidden": err_resp("Not allowed to this caller (e.g. an API key on a person-only route)."),
            "NotFound": err_resp("No such object in the caller's account."),
            "Conflict": err_resp("The same Idempotency-Key is still running; or (code cap_reached, field "
                                 "max_sandboxes or max_memory_mib) a create or fork past a cap a person set on the key."),
            "NoCapacity": err_resp("The sandbox host cannot take the sandbox (code insufficient_capacity): the "
                                   "message names what is short (memory, vCPUs, disk)."),
            "TooLarge": err_resp("The body is over the size limit."),
            "Unprocessable": err_resp("Idempotency-Key reused with another request, or too many rows."),
            "TooManyRequests": err_resp("Over the request rate, too many failed sign-ins, or the account has too "
                                        "many sandbox requests waiting (Retry-After says when to retry)."),
            "MethodNotAllowed": err_resp("The path exists, not with this method."),
            "UriTooLong": err_resp("The URL is longer than 8 KiB."),
            "HeadersTooLarge": err_resp("The headers are larger than 16 KiB."),
            "Internal": err_resp("Something failed on our side."),
            "Unavailable": err_resp("PostgreSQL or a sandbox host cannot answer now, or tally-api is stopping."),
        },
    },
}

text = json.dumps(doc, indent=1, sort_keys=False)
with open(sys.argv[1], "w") as f:
    f.write(text + "\n")
with open(sys.argv[2], "w") as f:
    f.write("/* Generated by api/openapi.py: do not edit. */\n#include \"api.h\"\n\n"
            "static const char doc[] =\n")
    for line in text.splitlines():
        f.write("        " + json.dumps(line + "\n") + "\n")
    f.write("        ;\n\nconst char *api_openapi_json(void)\n{\n        return doc;\n}\n")
