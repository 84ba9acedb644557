/* Unicode general-category range tables (generated into unicode_tables.c by
 * scripts/gen-unicode-tables.py) and the class tests the tokenizer uses. */
#ifndef MCV_UNICODE_TABLES_H
#define MCV_UNICODE_TABLES_H

#include <stdbool.h>
#include <stdint.h>

extern const uint32_t mcv_unicode_letter[][2];
extern const int mcv_unicode_n_letter;
extern const uint32_t mcv_unicode_mark[][2];
extern const int mcv_unicode_n_mark;
extern const uint32_t mcv_unicode_number[][2];
extern const int mcv_unicode_n_number;

bool mcv_unicode_is_letter(uint32_t cp); /* \p{L} */
bool mcv_unicode_is_mark(uint32_t cp);   /* \p{M} */
bool mcv_unicode_is_number(uint32_t cp); /* \p{N} */
bool mcv_unicode_is_space(uint32_t cp);  /* \s: the White_Space property */

#endif
