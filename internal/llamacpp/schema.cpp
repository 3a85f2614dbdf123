// The JSON-schema-to-grammar converter of llama.cpp's common library
// (libllama-common), with its errors as text.

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "json-schema-to-grammar.h"
#include "schema.h"

static char *dup(const std::string & s) {
    char *out = static_cast<char *>(malloc(s.size() + 1));
    if (out != nullptr) {
        memcpy(out, s.c_str(), s.size() + 1);
    }
    return out;
}

char *apiary_schema_to_grammar(const char *schema, size_t len, int *ok) {
    *ok = 0;
    try {
        auto parsed = common_json::parse(std::string(schema, len));
        std::string grammar = json_schema_to_grammar(parsed, false);
        *ok = 1;
        return dup(grammar);
    } catch (const std::exception & e) {
        return dup(e.what());
    } catch (...) {
        return dup("unknown error");
    }
}
