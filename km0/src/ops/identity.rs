//! Who runs an operator command: the operating-system user the process runs as, read from
//! the kernel (the owner of `/proc/self` is the process's effective user) and named through
//! `/etc/passwd`. Not an environment variable or a flag, which anyone could set to anything;
//! the audit records what the system vouches for.

use std::os::unix::fs::MetadataExt as _;

/// The operator's name as the audit records it: the effective user's login name, or
/// `uid:<n>` when the user has no entry in `/etc/passwd`, or `unknown` off Linux.
pub fn os_user() -> String {
    let Ok(meta) = std::fs::metadata("/proc/self") else {
        return "unknown".to_owned();
    };
    let uid = meta.uid();
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| name_of(&passwd, uid))
        .unwrap_or_else(|| format!("uid:{uid}"))
}

/// The login name of `uid` in a passwd file's text.
fn name_of(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let id: u32 = fields.next()?.parse().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_passwd_entry_of_the_uid() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      # a comment\n\
                      ana:x:1000:1000:Ana:/home/ana:/bin/sh\n\
                      broken-line\n";
        assert_eq!(name_of(passwd, 0).as_deref(), Some("root"));
        assert_eq!(name_of(passwd, 1000).as_deref(), Some("ana"));
        assert_eq!(name_of(passwd, 1001), None);
    }

    #[test]
    fn this_process_has_an_operator_name() {
        let name = os_user();
        assert!(!name.is_empty());
        assert_ne!(name, "unknown");
    }
}
