//! The model's chat template, rendered by minijinja configured like the Jinja2 environment of
//! Hugging Face's `apply_chat_template`.
use std::path::Path;

use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};

use super::tokenizer_config::TokenizerConfig;
use super::{pycompat, pyjson, strftime};
use crate::{Error, Result};

const TEMPLATE_NAME: &str = "chat_template";

/// One chat message as templates see it (`message['role']`, `message['content']`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The per-render switches of the template context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// End with the opening of the model's turn.
    pub add_generation_prompt: bool,
    /// Passed to the template only when `Some`: templates test `enable_thinking is defined`
    /// or `| default(...)`, so "not given" differs from `false`.
    pub enable_thinking: Option<bool>,
}

/// A compiled chat template plus the special token texts its context carries.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

/// A minijinja environment with Hugging Face's settings: `trim_blocks`, `lstrip_blocks`,
/// loop controls, no auto-escaping, HF's `tojson`, `raise_exception`, `strftime_now`, and
/// Python semantics for string methods, `trim` and printed values.
pub fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(pycompat::unknown_method);
    env.set_formatter(pycompat::formatter);
    env.add_filter("tojson", pyjson::tojson_filter);
    env.add_filter("trim", |v: &Value, chars: Option<&str>| {
        pycompat::trim_filter(v, chars)
    });
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function("strftime_now", |fmt: &str| {
        strftime::CivilTime::now_utc().format(fmt)
    });
    env
}

impl ChatTemplate {
    /// Compiles `source` with the special token texts the context will carry.
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self> {
        let source = source.into();
        let mut env = hf_environment();
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| Error::ChatTemplate(describe(&e)))?;
        Ok(Self {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    /// The model directory's template: `chat_template.jinja` if present, else the
    /// `chat_template` of `tokenizer_config.json` (`config`).
    pub fn from_dir(dir: &Path, config: &TokenizerConfig) -> Result<Self> {
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.is_file() {
            std::fs::read_to_string(&jinja).map_err(|source| Error::Io {
                path: jinja.clone(),
                source,
            })?
        } else if let Some(t) = &config.chat_template {
            t.clone()
        } else {
            return Err(Error::InvalidFile {
                path: dir.to_path_buf(),
                reason: "no chat template: neither chat_template.jinja nor a chat_template \
                         key in tokenizer_config.json"
                    .to_string(),
            });
        };
        Self::new(source, config.bos_token.clone(), config.eos_token.clone())
    }

    /// The template source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; the context holds `messages`, `add_generation_prompt`,
    /// `bos_token`, `eos_token` and, only when given, `enable_thinking` (no `tools`).
    pub fn render(&self, messages: &[Message], opts: &RenderOptions) -> Result<String> {
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from_serialize(messages)),
            (
                "add_generation_prompt",
                Value::from(opts.add_generation_prompt),
            ),
        ];
        if let Some(bos) = &self.bos_token {
            ctx.push(("bos_token", Value::from(bos.as_str())));
        }
        if let Some(eos) = &self.eos_token {
            ctx.push(("eos_token", Value::from(eos.as_str())));
        }
        if let Some(thinking) = opts.enable_thinking {
            ctx.push(("enable_thinking", Value::from(thinking)));
        }
        let ctx: Value = ctx.into_iter().collect();
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::ChatTemplate(describe(&e)))?;
        guarded(|| tmpl.render(ctx))
    }
}

/// Renders a template `source` over `ctx` in the [`hf_environment`] (for one-off templates
/// and the Python-semantics probes of the tests).
pub fn render_str(source: &str, ctx: Value) -> Result<String> {
    let env = hf_environment();
    guarded(|| env.render_str(source, ctx))
}

/// Runs a render, turning minijinja errors and panics into [`Error::ChatTemplate`].
/// minijinja 2.24 panics on some negative-step slices (`[][::-1]` indexes an empty
/// sequence); a template must never bring the host down, so the panic becomes an error.
fn guarded(render: impl FnOnce() -> Result<String, JinjaError>) -> Result<String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(render)) {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(e)) => Err(Error::ChatTemplate(describe(&e))),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Error::ChatTemplate(format!(
                "the template engine panicked while rendering: {what}"
            )))
        }
    }
}

/// A minijinja error with its chain of causes on one line.
fn describe(e: &JinjaError) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
        source = cause.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(tag: &str) -> std::path::PathBuf {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "memexec-template-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn chat_template_jinja_wins_over_tokenizer_config() {
        let dir = scratch_dir("source");
        let config = TokenizerConfig {
            chat_template: Some("from config".to_string()),
            ..TokenizerConfig::default()
        };
        assert_eq!(
            ChatTemplate::from_dir(&dir, &config).unwrap().source(),
            "from config"
        );
        std::fs::write(dir.join("chat_template.jinja"), "from file").unwrap();
        assert_eq!(
            ChatTemplate::from_dir(&dir, &config).unwrap().source(),
            "from file"
        );
        std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
        let err = ChatTemplate::from_dir(&dir, &TokenizerConfig::default()).unwrap_err();
        assert!(err.to_string().contains("no chat template"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn enable_thinking_is_undefined_unless_given() {
        let t = ChatTemplate::new(
            "{{ enable_thinking is defined }} {{ bos_token }}",
            Some("<bos>".into()),
            None,
        )
        .unwrap();
        let mut opts = RenderOptions::default();
        assert_eq!(t.render(&[], &opts).unwrap(), "False <bos>");
        opts.enable_thinking = Some(false);
        assert_eq!(t.render(&[], &opts).unwrap(), "True <bos>");
    }

    #[test]
    fn syntax_errors_and_raise_exception_are_errors() {
        assert!(matches!(
            ChatTemplate::new("{% if %}", None, None),
            Err(Error::ChatTemplate(_))
        ));
        let t = ChatTemplate::new("{{ raise_exception('no tools here') }}", None, None).unwrap();
        let err = t.render(&[], &RenderOptions::default()).unwrap_err();
        assert!(err.to_string().contains("no tools here"), "{err}");
    }
}
