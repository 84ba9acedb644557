/* The routing observer of mcv_ctx (model.h); its one call site is in moe.c
 * right after the router, so the setter lives apart from the layer loop. */
#include "model_impl.h"

void mcv_ctx_set_route_hook(mcv_ctx *c, mcv_route_hook_fn fn, void *user)
{
	c->route_hook = fn;
	c->route_hook_user = user;
}

void mcv_ctx_set_route_override(mcv_ctx *c, mcv_route_override_fn fn, void *user)
{
	c->route_override = fn;
	c->route_override_user = user;
}
