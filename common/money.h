/* money.h — exact money. Amounts are int64 nano-dollars (10^-9 USD); rates are
 * nano-dollars per billing unit. No floating point may touch these values.
 *
 * Rounding rule (docs/billing.md): intermediate amounts keep full precision as
 * integers; an amount is rounded once, half away from zero, at the place the
 * caller asks for (nano-dollars for a rated quantity, cents for an invoice line). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define NANODOLLARS_PER_DOLLAR INT64_C(1000000000)
#define NANODOLLARS_PER_CENT   INT64_C(10000000)

/* q * rate / div rounded half away from zero, computed in 128 bits.
 * Returns 0, -EDOM if div is 0, or -ERANGE if the result does not fit int64. */
int money_muldiv(int64_t q, int64_t rate, int64_t div, int64_t *ret);

/* Divides exactly-held n by d, rounding half away from zero (d > 0). */
int64_t money_div_round(int64_t n, int64_t d);

/* Rounds nano-dollars to whole cents, half away from zero; returns cents. */
int64_t money_to_cents(int64_t nanodollars);

/* Parses a decimal dollar amount ("0.025", "17.08", "-3") into nano-dollars,
 * exactly; refuses more than 9 decimals, signs in the middle, overflow.
 * Returns 0 or -EINVAL / -ERANGE. */
int money_parse(const char *s, int64_t *ret);

/* Formats nano-dollars as dollars with `decimals` (0..9) places, rounding half
 * away from zero: money_format(buf, n, 17083333333, 2) -> "17.08". Returns the
 * length as snprintf does. */
int money_format(char *buf, size_t size, int64_t nanodollars, int decimals);
