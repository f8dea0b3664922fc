// SPDX-License-Identifier: MIT
/* Small json-c accessors shared by the modules that read JSON documents. */
#include <json-c/json.h>

#include "base.h"

const char *json_get_string(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!o || !json_object_object_get_ex(o, key, &v) ||
	    !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}
