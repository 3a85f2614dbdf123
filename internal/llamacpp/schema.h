#ifndef APIARY_SCHEMA_H
#define APIARY_SCHEMA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// apiary_schema_to_grammar turns a JSON schema into a GBNF grammar. It
// returns a malloc'd string the caller frees: the grammar when *ok is set,
// else the reason the conversion failed (NULL when out of memory).
char *apiary_schema_to_grammar(const char *schema, size_t len, int *ok);

#ifdef __cplusplus
}
#endif

#endif
