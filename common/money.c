/* money.c — see money.h. Integers only; every operation checks for overflow. */
#include "money.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>

static __int128 div_round128(__int128 n, __int128 d)
{
        if (d < 0) {
                n = -n;
                d = -d;
        }
        __int128 q = n / d, r = n % d;
        if (r < 0)
                r = -r;
        if (2 * r >= d)
                q += n < 0 ? -1 : 1;
        return q;
}

int money_muldiv(int64_t q, int64_t rate, int64_t div, int64_t *ret)
{
        if (div == 0)
                return -EDOM;
        __int128 v = div_round128((__int128)q * rate, div);
        if (v > INT64_MAX || v < INT64_MIN)
                return -ERANGE;
        *ret = (int64_t)v;
        return 0;
}

int64_t money_div_round(int64_t n, int64_t d)
{
        return (int64_t)div_round128(n, d);
}

int64_t money_to_cents(int64_t nanodollars)
{
        return money_div_round(nanodollars, NANODOLLARS_PER_CENT);
}

int money_parse(const char *s, int64_t *ret)
{
        bool neg = false;
        if (*s == '-' || *s == '+')
                neg = *s++ == '-';
        if (*s == '$')
                s++;
        __int128 whole = 0, frac = 0;
        int digits = 0, fdigits = 0;
        for (; *s >= '0' && *s <= '9'; s++, digits++) {
                whole = whole * 10 + (*s - '0');
                if (whole > INT64_MAX / NANODOLLARS_PER_DOLLAR + 1)
                        return -ERANGE;
        }
        if (*s == '.') {
                for (s++; *s >= '0' && *s <= '9'; s++, fdigits++) {
                        if (fdigits == 9)
                                return -EINVAL;
                        frac = frac * 10 + (*s - '0');
                }
        }
        if (*s != '\0' || digits + fdigits == 0)
                return -EINVAL;
        for (int i = fdigits; i < 9; i++)
                frac *= 10;
        __int128 v = whole * NANODOLLARS_PER_DOLLAR + frac;
        if (neg)
                v = -v;
        if (v > INT64_MAX || v < INT64_MIN)
                return -ERANGE;
        *ret = (int64_t)v;
        return 0;
}

int money_format(char *buf, size_t size, int64_t nanodollars, int decimals)
{
        if (decimals < 0)
                decimals = 0;
        if (decimals > 9)
                decimals = 9;
        int64_t unit = 1;
        for (int i = decimals; i < 9; i++)
                unit *= 10;
        __int128 v = div_round128(nanodollars, unit);
        bool neg = v < 0;
        if (neg)
                v = -v;
        int64_t scale = 1;
        for (int i = 0; i < decimals; i++)
                scale *= 10;
        long long whole = (long long)(v / scale), frac = (long long)(v % scale);
        if (decimals == 0)
                return snprintf(buf, size, "%s%lld", neg ? "-" : "", whole);
        return snprintf(buf, size, "%s%lld.%0*lld", neg ? "-" : "", whole, decimals, frac);
}
