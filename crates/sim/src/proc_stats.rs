//! What Linux's `/proc` says about a process that the benchmarks report: the CPU time it has used
//! (`utime + stime` of `/proc/<pid>/stat`, all its threads, in clock ticks) and its peak resident memory
//! (`VmHWM` of `/proc/<pid>/status`). The parsers are pure; reading the files is a line each.

/// `AT_CLKTCK` in the auxiliary vector: the clock ticks per second `/proc` counts CPU time in (what
/// `sysconf(_SC_CLK_TCK)` answers).
const AT_CLKTCK: u64 = 17;

/// CPU time (user and system, every thread) a process has used, in seconds; `pid` may be `self`.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = cpu_ticks(&stat)?;
    let per_second = clock_ticks_per_second()?;
    #[allow(clippy::cast_precision_loss)]
    Some(ticks as f64 / per_second as f64)
}

/// The clock ticks per second of this system, from this process's auxiliary vector.
pub fn clock_ticks_per_second() -> Option<u64> {
    let auxv = std::fs::read("/proc/self/auxv").ok()?;
    auxv_value(&auxv, AT_CLKTCK).filter(|ticks| *ticks > 0)
}

/// `utime + stime` of a `/proc/<pid>/stat` line. The second field, the command's name in parentheses, may
/// itself hold spaces and parentheses, so the fields are counted from after the last `)`: the third field
/// (state) comes first there, and `utime` and `stime` are the 14th and 15th.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after) = stat.rsplit_once(')')?;
    let mut fields = after.split_whitespace().skip(14 - 3);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    user.checked_add(system)
}

/// The value of `key` in an auxiliary vector: pairs of native-endian machine words, ending at key 0.
pub fn auxv_value(auxv: &[u8], key: u64) -> Option<u64> {
    let word = std::mem::size_of::<usize>();
    let read = |bytes: &[u8]| -> Option<u64> {
        match word {
            8 => Some(u64::from_ne_bytes(bytes.try_into().ok()?)),
            4 => Some(u64::from(u32::from_ne_bytes(bytes.try_into().ok()?))),
            _ => None,
        }
    };
    for pair in auxv.chunks_exact(2 * word) {
        let (name, value) = pair.split_at(word);
        match read(name)? {
            0 => return None,
            found if found == key => return read(value),
            _ => {}
        }
    }
    None
}

/// Peak resident memory of a process in MiB (`VmHWM`); `pid` may be `self`.
pub fn peak_rss_mib(pid: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    vm_hwm_mib(&status)
}

/// `VmHWM` of a `/proc/<pid>/status` text, in MiB.
pub fn vm_hwm_mib(status: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_last_parenthesis() {
        // Fields from the third: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
        // stime ...
        let tail = "S 1 2 3 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 12345 1000000 500";
        assert_eq!(cpu_ticks(&format!("4242 (gpu-operator) {tail}")), Some(325));
        // A name with spaces and parentheses, as `prctl` lets a process call itself.
        assert_eq!(cpu_ticks(&format!("4242 (a) b (c) 1 2) {tail}")), Some(325));
        assert_eq!(cpu_ticks(&format!("4242 (tokio-rt worker) {tail}\n")), Some(325));
        assert_eq!(cpu_ticks("4242 (short) S 1 2"), None, "too few fields");
        assert_eq!(cpu_ticks("no parenthesis at all"), None);
        assert_eq!(cpu_ticks("1 (x) S 1 2 3 0 -1 0 0 0 0 0 x 75"), None);
    }

    #[test]
    fn the_clock_tick_is_found_in_the_auxiliary_vector() {
        let pairs: &[(usize, usize)] = &[(6, 4096), (17, 100), (25, 1), (0, 0), (17, 250)];
        let auxv: Vec<u8> = pairs
            .iter()
            .flat_map(|(k, v)| [k.to_ne_bytes(), v.to_ne_bytes()])
            .flatten()
            .collect();
        assert_eq!(auxv_value(&auxv, 17), Some(100));
        assert_eq!(auxv_value(&auxv, 99), None, "the vector ends at key 0");
        assert_eq!(auxv_value(&auxv[..5], 17), None, "a torn vector");
        // And this machine's, as `getconf CLK_TCK` says.
        let getconf = std::process::Command::new("getconf").arg("CLK_TCK").output();
        let expected = getconf
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse::<u64>().ok());
        assert_eq!(clock_ticks_per_second(), Some(expected.unwrap_or(100)));
        assert!(cpu_seconds("self").is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn peak_memory_is_vm_hwm() {
        assert_eq!(
            vm_hwm_mib("Name:\tx\nVmPeak:\t 9000 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1024 kB\n"),
            Some(2.0)
        );
        assert_eq!(vm_hwm_mib("Name:\tx\n"), None);
    }
}
