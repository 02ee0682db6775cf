//! The channel configuration: `channels/channels.json` under the state
//! directory, and each Telegram profile's credential file.
//!
//! ```json
//! {"telegram": {"ops": {"tokenFile": "/home/me/.config/ops.token",
//!   "allowedUserIds": ["1234"], "allowedChatIds": ["1234"],
//!   "audiences": ["operator"], "apiBase": "http://127.0.0.1:8081"}}}
//! ```
//!
//! Invariants:
//! - The directory, the file and every token file must be private to the
//!   user (no group or other permission bits); a token file path is
//!   absolute. Anything else is refused with one safe diagnostic that names
//!   the profile and the fix, never the token or a path.
//! - No file at all means no channels (no diagnostic): channels are
//!   optional. A broken file is one diagnostic for the whole configuration;
//!   a broken profile is one diagnostic for that profile, and the other
//!   profiles still run.
//! - The token is read only here and handed only to that profile's adapter.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The Bot API base when a profile names none.
pub const TELEGRAM_API: &str = "https://api.telegram.org";

/// `channels.json` as written by the user.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    #[serde(default)]
    telegram: BTreeMap<String, ProfileFile>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProfileFile {
    token_file: PathBuf,
    allowed_user_ids: Vec<String>,
    allowed_chat_ids: Vec<String>,
    audiences: Vec<String>,
    api_base: Option<String>,
}

/// One usable Telegram profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub token: String,
    pub allowed_user_ids: Vec<i64>,
    pub allowed_chat_ids: Vec<i64>,
    pub audiences: Vec<String>,
    pub api_base: String,
}

/// What the configuration gave: each profile, usable or with its
/// diagnostic, and the diagnostic of a broken file.
#[derive(Debug, Default)]
pub struct Loaded {
    pub profiles: BTreeMap<String, Result<Profile, String>>,
    pub diagnostic: Option<String>,
}

/// Reads the configuration in `dir`.
pub fn load(dir: &Path) -> Loaded {
    let path = dir.join("channels.json");
    if !path.exists() {
        return Loaded::default();
    }
    if !private(dir) || !private(&path) {
        return broken(
            "the channel configuration must be private to its owner (chmod 700 the channels directory and 600 channels.json)",
        );
    }
    let Ok(text) = std::fs::read_to_string(&path) else {
        return broken("the channel configuration could not be read");
    };
    let file: File = match serde_json::from_str(&text) {
        Ok(file) => file,
        Err(_) => {
            return broken(
                "channels.json is not a valid channel configuration (see docs/CHANNELS.md)",
            );
        }
    };
    Loaded {
        profiles: file
            .telegram
            .into_iter()
            .map(|(name, profile)| {
                let checked = check(&name, profile);
                (name, checked)
            })
            .collect(),
        diagnostic: None,
    }
}

fn broken(diagnostic: &str) -> Loaded {
    Loaded {
        profiles: BTreeMap::new(),
        diagnostic: Some(diagnostic.into()),
    }
}

fn check(name: &str, profile: ProfileFile) -> Result<Profile, String> {
    let valid_name = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'));
    if !valid_name {
        return Err("a profile name must be 1-128 characters of [A-Za-z0-9._:-]".into());
    }
    let ids = |ids: &[String]| -> Option<Vec<i64>> {
        ids.iter().map(|id| id.parse::<i64>().ok()).collect()
    };
    let (Some(users), Some(chats)) = (
        ids(&profile.allowed_user_ids),
        ids(&profile.allowed_chat_ids),
    ) else {
        return Err(format!(
            "profile {name}: allowedUserIds and allowedChatIds must be decimal Telegram ids"
        ));
    };
    if users.is_empty() || chats.is_empty() {
        return Err(format!(
            "profile {name}: allow at least one user id and one chat id"
        ));
    }
    if profile.audiences.is_empty() {
        return Err(format!(
            "profile {name}: name at least one audience it answers for"
        ));
    }
    if !profile.token_file.is_absolute() {
        return Err(format!(
            "profile {name}: tokenFile must be an absolute path"
        ));
    }
    if !profile.token_file.is_file() {
        return Err(format!(
            "profile {name}: the token file is missing or not a file"
        ));
    }
    if !private(&profile.token_file) {
        return Err(format!(
            "profile {name}: the token file must be private to its owner (chmod 600)"
        ));
    }
    let token = std::fs::read_to_string(&profile.token_file)
        .map(|text| text.trim().to_owned())
        .unwrap_or_default();
    if token.is_empty() || token.len() > 512 || token.contains(char::is_whitespace) {
        return Err(format!(
            "profile {name}: the token file must hold one Bot API token"
        ));
    }
    let api_base = profile.api_base.unwrap_or_else(|| TELEGRAM_API.into());
    if !api_base.starts_with("http://") {
        return Err(format!(
            "profile {name}: this adapter speaks plain HTTP only; set apiBase to a local Bot API server or TLS proxy (http://…)"
        ));
    }
    Ok(Profile {
        name: name.into(),
        token,
        allowed_user_ids: users,
        allowed_chat_ids: chats,
        audiences: profile.audiences,
        api_base,
    })
}

/// Whether `path` exists and has no group or other permission bits.
fn private(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|meta| meta.permissions().mode() & 0o077 == 0)
}
