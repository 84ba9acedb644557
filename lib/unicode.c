/* Unicode class tests for the pre-tokenizer: binary search in the generated
 * category tables, with an ASCII shortcut since most text is ASCII. */
#include "unicode_tables.h"

static bool in_ranges(const uint32_t (*r)[2], int n, uint32_t cp)
{
	int lo = 0, hi = n - 1;
	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		if (cp < r[mid][0])
			hi = mid - 1;
		else if (cp > r[mid][1])
			lo = mid + 1;
		else
			return true;
	}
	return false;
}

bool mcv_unicode_is_letter(uint32_t cp)
{
	if (cp < 0x80)
		return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
	return in_ranges(mcv_unicode_letter, mcv_unicode_n_letter, cp);
}

bool mcv_unicode_is_mark(uint32_t cp)
{
	if (cp < 0x300)
		return false;
	return in_ranges(mcv_unicode_mark, mcv_unicode_n_mark, cp);
}

bool mcv_unicode_is_number(uint32_t cp)
{
	if (cp < 0x80)
		return cp >= '0' && cp <= '9';
	return in_ranges(mcv_unicode_number, mcv_unicode_n_number, cp);
}

/* White_Space is a short, stable list (PropList.txt); Python's str.isspace
 * is a different set (it adds U+001C..U+001F), so it is spelled out here. */
bool mcv_unicode_is_space(uint32_t cp)
{
	if (cp < 0x80)
		return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
	switch (cp) {
	case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
	case 0x202F: case 0x205F: case 0x3000:
		return true;
	}
	return cp >= 0x2000 && cp <= 0x200A;
}
