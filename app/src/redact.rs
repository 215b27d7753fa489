//! Secrets kept out of messages: the one place that knows how to hide a URL's password,
//! for the settings and the Redis connections alike.

/// A URL with any password in it replaced, for messages.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_redacted_for_messages() {
        assert_eq!(
            redacted("redis://user:hunter2@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redacted("redis://host:6379"), "redis://host:6379");
    }
}
