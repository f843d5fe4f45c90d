/*
 * config_json.h - reading a Hugging Face config.json: the file as one JSON
 * object, and its typed fields, with the one-line errors every family's
 * loader gives (model_config.c reads the model_type, opt_config.c and
 * llama_config.c the rest), so the three read the file the same way.
 */
#ifndef SL_CONFIG_JSON_H
#define SL_CONFIG_JSON_H

#include <jansson.h>
#include <stdbool.h>

/* Parse path into *root, an object the caller json_decref()s.  A file that
 * cannot be opened is SL_ENOTFOUND ("cannot open model config"), bad JSON
 * SL_EFORMAT naming the line, another JSON value SL_EFORMAT ("not a JSON
 * object"); *root is NULL on error. */
int sl_config_json_open(const char *path, json_t **root);

/* Field key of obj.  Absent or null: def, or, where required,
 * SL_EFORMAT "missing field".  Of the wrong type (an integer outside
 * -1..2^30, a number, true or false): SL_EFORMAT naming path and key. */
int sl_config_get_int(json_t *obj, const char *key, int def, bool required, const char *path,
		      int *out);
int sl_config_get_num(json_t *obj, const char *key, double def, bool required, const char *path,
		      double *out);
int sl_config_get_bool(json_t *obj, const char *key, bool def, const char *path, bool *out);

#endif
