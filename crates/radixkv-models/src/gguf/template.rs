//! The chat template of a GGUF file (`tokenizer.chat_template`, Jinja),
//! rendered with minijinja as Hugging Face's `apply_chat_template` does.

use super::GgufError;
use minijinja::{context, Environment};

/// One message of a chat.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Its text.
    pub content: String,
}

impl Message {
    /// A user's message.
    pub fn user(content: impl Into<String>) -> Message {
        Message {
            role: "user".into(),
            content: content.into(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Message {
        Message {
            role: "system".into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles `source`.
    pub fn new(source: &str) -> Result<ChatTemplate, GgufError> {
        let mut env = Environment::new();
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| GgufError::Template(e.to_string()))?;
        Ok(ChatTemplate { env })
    }

    /// The prompt text of `messages`; with `generation_prompt`, ending
    /// where the assistant's reply begins.
    pub fn render(
        &self,
        messages: &[Message],
        generation_prompt: bool,
    ) -> Result<String, GgufError> {
        let t = self
            .env
            .get_template("chat")
            .map_err(|e| GgufError::Template(e.to_string()))?;
        t.render(context! {
            messages => messages,
            add_generation_prompt => generation_prompt,
        })
        .map_err(|e| GgufError::Template(e.to_string()))
    }
}
