// C ABI of the Jinja engine in minijinja_capi/src/lib.rs (a Rust staticlib). Only
// chat_template.cc includes this; everything else uses fucina::ChatTemplate.
//
// Conventions: strings are NUL-terminated UTF-8; functions return 0 on success, non-zero on
// failure with a message in *err. Every char* returned (in *out or *err) is owned by the caller
// and released with fucina_jinja_free; template handles with fucina_jinja_template_free.
// A compiled template is immutable and may be rendered from several threads at once.
#ifndef FUCINA_MODELS_CHAT_JINJA_CAPI_H_
#define FUCINA_MODELS_CHAT_JINJA_CAPI_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FucinaJinjaTemplate FucinaJinjaTemplate;

int fucina_jinja_compile(const char* source, FucinaJinjaTemplate** out, char** err);
// context_json: a JSON object whose members become the template's variables.
int fucina_jinja_render_compiled(const FucinaJinjaTemplate* tmpl, const char* context_json,
                                 char** out, char** err);
// Compile + render in one call.
int fucina_jinja_render(const char* source, const char* context_json, char** out, char** err);
void fucina_jinja_free(char* s);
void fucina_jinja_template_free(FucinaJinjaTemplate* tmpl);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FUCINA_MODELS_CHAT_JINJA_CAPI_H_
