//! Placeholder until the masking branch lands (same API).
use std::borrow::Cow;
use std::collections::BTreeMap;

#[derive(Debug, Default, Clone)]
pub struct Masker {
    secrets: Vec<String>,
}

impl Masker {
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        Self { secrets: secrets.into_iter().filter(|s| s.len() >= 4).collect() }
    }
    pub fn from_env(env: &BTreeMap<String, String>, extra_names: &[String]) -> Self {
        let names = ["KEY", "SECRET", "TOKEN", "PASSWORD"];
        Self::new(
            env.iter()
                .filter(|(k, _)| {
                    let up = k.to_ascii_uppercase();
                    names.iter().any(|n| up.contains(n)) || extra_names.contains(k)
                })
                .map(|(_, v)| v.clone()),
        )
    }
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = Cow::Owned(out.replace(s.as_str(), "***"));
            }
        }
        out
    }
    pub fn mask_json(&self, v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => *s = self.mask(s).into_owned(),
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| self.mask_json(x)),
            serde_json::Value::Object(o) => o.values_mut().for_each(|x| self.mask_json(x)),
            _ => {}
        }
    }
}
