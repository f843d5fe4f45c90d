/*
 * config_json.c - config.json as a JSON object and its typed fields
 * (config_json.h).
 */
#include "config_json.h"
#include "sl_common.h"

#include <stdio.h>

int sl_config_json_open(const char *path, json_t **root)
{
	json_error_t jerr;
	*root = json_load_file(path, 0, &jerr);
	if (!*root) {
		FILE *f = fopen(path, "rb");
		if (!f)
			return sl_err(SL_ENOTFOUND, "%s: cannot open model config", path);
		fclose(f);
		return sl_err(SL_EFORMAT, "%s:%d: not valid JSON: %s", path, jerr.line, jerr.text);
	}
	if (!json_is_object(*root)) {
		json_decref(*root);
		*root = NULL;
		return sl_err(SL_EFORMAT, "%s: not a JSON object", path);
	}
	return 0;
}

int sl_config_get_int(json_t *obj, const char *key, int def, bool required, const char *path,
		      int *out)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		if (required)
			return sl_err(SL_EFORMAT, "%s: missing field '%s'", path, key);
		*out = def;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < -1 ||
	    json_integer_value(v) > (1 << 30))
		return sl_err(SL_EFORMAT, "%s: field '%s' is not a valid integer", path, key);
	*out = (int)json_integer_value(v);
	return 0;
}

int sl_config_get_num(json_t *obj, const char *key, double def, bool required, const char *path,
		      double *out)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		if (required)
			return sl_err(SL_EFORMAT, "%s: missing field '%s'", path, key);
		*out = def;
		return 0;
	}
	if (!json_is_number(v))
		return sl_err(SL_EFORMAT, "%s: field '%s' is not a number", path, key);
	*out = json_number_value(v);
	return 0;
}

int sl_config_get_bool(json_t *obj, const char *key, bool def, const char *path, bool *out)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return sl_err(SL_EFORMAT, "%s: field '%s' is not true or false", path, key);
	*out = json_is_true(v);
	return 0;
}
