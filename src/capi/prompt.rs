//! Prompt inspection: what the model is fed for a stage call, without generating.
use std::ffi::c_char;

use super::call::parse_input;
use super::guard::guard;
use super::handle::{lookup, memexec};
use super::status::memexec_status;
use super::strings::{arg_str, into_c_string, require_out, write_out};

/// Writes the prompt of a stage call as JSON to `*out_json` (required; free with
/// `memexec_string_free`): `{"messages": [{"role", "content"}], "text": "<rendered template>",
/// "ids": [<prompt token ids>]}` — exactly what `memexec_call` would feed the model.
///
/// `stage` and `input_json` as for `memexec_call`. Runs on the calling thread (no MLX work, no
/// queueing). Thread-safe.
///
/// Returns: `OK`; `NULL_ARGUMENT`; `INVALID_UTF8`; `INVALID_JSON`; `GENERATION_FAILED` (the
/// template or tokenizer failed on this input); `INVALID_HANDLE`; `INTERNAL`.
#[no_mangle]
pub extern "C" fn memexec_prompt(
    handle: *mut memexec,
    stage: *const c_char,
    input_json: *const c_char,
    out_json: *mut *mut c_char,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        require_out(out_json, "out_json")?;
        let h = lookup(handle)?;
        let stage = arg_str(stage, "stage")?;
        let input = parse_input(arg_str(input_json, "input_json")?)?;
        let p = h.engine.prompt(stage, &input)?;
        let json = serde_json::json!({ "messages": p.messages, "text": p.text, "ids": p.ids });
        write_out(out_json, into_c_string(json.to_string()));
        Ok(memexec_status::Ok)
    })
}

/// Writes the messages of a stage call as a JSON array of `{"role", "content"}` to
/// `*out_json` (required; free with `memexec_string_free`), without a model: `system =
/// input.system ?? the stage's default`, included only when non-empty.
///
/// `stages_json` (NULL = the built-in defaults only) is the `stages` object of a configuration
/// document (`{"stage": {"adapter"?, "system"?}}`), laid over the built-in defaults.
/// Thread-safe; needs no handle.
///
/// Returns: `OK`; `NULL_ARGUMENT`; `INVALID_UTF8`; `INVALID_JSON`; `INTERNAL`.
#[no_mangle]
pub extern "C" fn memexec_messages(
    stages_json: *const c_char,
    stage: *const c_char,
    input_json: *const c_char,
    out_json: *mut *mut c_char,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        require_out(out_json, "out_json")?;
        let stages: std::collections::BTreeMap<String, crate::config::StageSpec> =
            match super::strings::opt_arg_str(stages_json, "stages_json")? {
                None => Default::default(),
                Some(text) => {
                    serde_json::from_str(text).map_err(|e| crate::Error::InvalidJson {
                        what: "stages_json",
                        message: e.to_string(),
                    })?
                }
            };
        let stage = arg_str(stage, "stage")?;
        let input = parse_input(arg_str(input_json, "input_json")?)?;
        let messages = crate::config::stage_registry(&stages)?.messages(stage, &input);
        let json =
            serde_json::to_string(&messages).map_err(|e| crate::Error::Internal(e.to_string()))?;
        write_out(out_json, into_c_string(json));
        Ok(memexec_status::Ok)
    })
}
