/* Error reports: one line, set where the failure is understood best. */
#include "mcv.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int mcv_error_set(mcv_error *e, int code, const char *fmt, ...)
{
	if (e) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof e->msg, fmt, ap);
		va_end(ap);
		e->code = code;
	}
	return code;
}

int mcv_error_prefix(mcv_error *e, const char *fmt, ...)
{
	if (!e)
		return MCV_EINVAL;
	char pre[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(pre, sizeof pre, fmt, ap);
	va_end(ap);
	/* Shift the old message right and put "pre: " in front (truncating). */
	size_t np = strlen(pre) + 2, cap = sizeof e->msg - 1;
	if (np > cap)
		np = cap;
	size_t nold = strnlen(e->msg, cap);
	if (np + nold > cap)
		nold = cap - np;
	memmove(e->msg + np, e->msg, nold);
	memcpy(e->msg, pre, np - 2 < cap ? np - 2 : cap);
	if (np >= 2) { e->msg[np - 2] = ':'; e->msg[np - 1] = ' '; }
	e->msg[np + nold] = 0;
	return e->code;
}

const char *mcv_strerror(int code)
{
	switch (code) {
	case MCV_OK: return "success";
	case MCV_EIO: return "input/output error";
	case MCV_EFORMAT: return "malformed file";
	case MCV_ENOMEM: return "out of memory";
	case MCV_EINVAL: return "invalid argument";
	case MCV_EUNSUPPORTED: return "unsupported";
	case MCV_ENOTFOUND: return "not found";
	case MCV_EBUDGET: return "memory budget cannot be met";
	}
	return "unknown error";
}
