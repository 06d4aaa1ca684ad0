//! A file seen through an overlay held in memory: reads see what was
//! written, writes never reach the file. Start-up and `tetherd check`
//! open redb through it to read the store's marks before anything is
//! written: after a crash redb must first recover the file, which writes
//! to it, and damage found meanwhile must leave every byte as it was.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::store_io::{FileIo, Opener};

/// The overlay's unit: a write changes whole pages of it.
const PAGE: u64 = 4096;

/// Opens files read-only under an overlay (see the module docs).
#[derive(Debug)]
pub(super) struct OverlayOpener {
    inner: Arc<dyn Opener>,
    /// Every file opened, so that what was written over it can be written
    /// through once it is known to be wanted ([`OverlayOpener::write_through`]).
    opened: Mutex<Vec<(PathBuf, Arc<OverlayFile>)>>,
}

impl OverlayOpener {
    pub(super) fn new(inner: Arc<dyn Opener>) -> OverlayOpener {
        OverlayOpener {
            inner,
            opened: Mutex::new(Vec::new()),
        }
    }

    /// Writes what was written over `path` to the file itself: every page
    /// but the first, a sync, then the first and a sync. Start-up uses it
    /// once the log verified, so that redb's recovery, done in memory to
    /// read the store's marks without writing, need not be done again
    /// (it reads the whole file). The first page holds redb's header,
    /// which is what says the recovery is done, so it goes last: a crash
    /// before it leaves a file that recovers as before.
    pub(super) fn write_through(&self, path: &Path) -> io::Result<()> {
        let opened = self.opened.lock().unwrap_or_else(PoisonError::into_inner);
        for (at, file) in opened.iter().filter(|(p, _)| p == path) {
            let state = file.lock();
            if state.pages.is_empty() && state.len == file.file_len {
                continue;
            }
            let target = self.inner.open(at)?;
            if target.len()? != state.len {
                target.set_len(state.len)?;
            }
            let write = |number: u64, page: &[u8]| -> io::Result<()> {
                let start = number * PAGE;
                if start >= state.len {
                    return Ok(());
                }
                let take = (state.len - start).min(PAGE) as usize;
                target.write_all_at(&page[..take], start)
            };
            for (&number, page) in state.pages.range(1..) {
                write(number, page)?;
            }
            target.sync_data()?;
            if let Some(first) = state.pages.get(&0) {
                write(0, first)?;
                target.sync_data()?;
            }
        }
        Ok(())
    }
}

impl Opener for OverlayOpener {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn FileIo>> {
        self.open_read(path)
    }

    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn FileIo>> {
        let file = self.open_overlay(path)?;
        Ok(file)
    }
}

impl OverlayOpener {
    fn open_overlay(&self, path: &Path) -> io::Result<Arc<OverlayFile>> {
        // Opened to write only so that redb can take its write lock on it
        // (a lock needs a descriptor open for writing); nothing is written
        // through it. A missing file is not made.
        if !path.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist", path.display()),
            ));
        }
        let file = self.inner.open(path)?;
        let len = file.len()?;
        let overlay = Arc::new(OverlayFile {
            file,
            file_len: len,
            state: Mutex::new(Overlay {
                len,
                pages: BTreeMap::new(),
            }),
        });
        self.opened
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((path.to_path_buf(), overlay.clone()));
        Ok(overlay)
    }
}

#[derive(Debug)]
struct OverlayFile {
    file: Arc<dyn FileIo>,
    /// The file's length when opened: nothing writes to it meanwhile.
    file_len: u64,
    state: Mutex<Overlay>,
}

#[derive(Debug)]
struct Overlay {
    /// The length as written through the overlay.
    len: u64,
    /// Pages written, by number.
    pages: BTreeMap<u64, Box<[u8]>>,
}

impl OverlayFile {
    fn lock(&self) -> MutexGuard<'_, Overlay> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Page `number` as the file holds it (zeros past its end).
    fn page_of_file(&self, number: u64) -> io::Result<Box<[u8]>> {
        let mut page = vec![0u8; PAGE as usize].into_boxed_slice();
        let start = number * PAGE;
        let file_len = self.file_len;
        if start < file_len {
            let take = (file_len - start).min(PAGE) as usize;
            self.file.read_exact_at(&mut page[..take], start)?;
        }
        Ok(page)
    }
}

impl FileIo for OverlayFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.lock().len)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let state = self.lock();
        let end = offset + buf.len() as u64;
        if end > state.len {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        let mut at = offset;
        while at < end {
            let number = at / PAGE;
            let within = (at % PAGE) as usize;
            let take = ((PAGE - at % PAGE).min(end - at)) as usize;
            let out = &mut buf[(at - offset) as usize..(at - offset) as usize + take];
            match state.pages.get(&number) {
                Some(page) => out.copy_from_slice(&page[within..within + take]),
                None => out.copy_from_slice(&self.page_of_file(number)?[within..within + take]),
            }
            at += take as u64;
        }
        Ok(())
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.lock();
        let end = offset + data.len() as u64;
        let mut at = offset;
        while at < end {
            let number = at / PAGE;
            let within = (at % PAGE) as usize;
            let take = ((PAGE - at % PAGE).min(end - at)) as usize;
            let page = match state.pages.entry(number) {
                std::collections::btree_map::Entry::Occupied(page) => page.into_mut(),
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(self.page_of_file(number)?)
                }
            };
            let from = (at - offset) as usize;
            page[within..within + take].copy_from_slice(&data[from..from + take]);
            at += take as u64;
        }
        state.len = state.len.max(end);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.lock();
        if len < state.len {
            // What lay past the new end reads as zeros if the file grows
            // again: keep zeroed pages for the part of the file cut off.
            let first_cut = len / PAGE;
            let file_len = self.file_len;
            let last = file_len.max(state.len).div_ceil(PAGE);
            for number in first_cut..last {
                let mut page = match state.pages.remove(&number) {
                    Some(page) => page,
                    None => self.page_of_file(number)?,
                };
                let keep = len.saturating_sub(number * PAGE).min(PAGE) as usize;
                page[keep..].fill(0);
                state.pages.insert(number, page);
            }
        }
        state.len = len;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn allocate(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    fn free_space(&self) -> io::Result<u64> {
        self.file.free_space()
    }

    fn lock_handle(&self) -> io::Result<Option<File>> {
        self.file.lock_handle()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::store_io::OsOpener;

    #[test]
    fn writes_are_read_back_and_never_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let original: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &original).unwrap();
        let file = OverlayOpener::new(Arc::new(OsOpener)).open(&path).unwrap();
        file.write_all_at(&[7u8; 5000], 3000).unwrap();
        file.set_len(12_000).unwrap();
        file.write_all_at(b"end", 11_997).unwrap();
        let mut seen = vec![0u8; 12_000];
        file.read_exact_at(&mut seen, 0).unwrap();
        let mut want = original.clone();
        want[3000..8000].fill(7);
        want.resize(12_000, 0);
        want[11_997..].copy_from_slice(b"end");
        assert_eq!(seen, want);
        file.set_len(100).unwrap();
        file.set_len(200).unwrap();
        let mut tail = vec![1u8; 100];
        file.read_exact_at(&mut tail, 100).unwrap();
        assert!(tail.iter().all(|&b| b == 0), "bytes cut off came back");
        file.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), original);
    }
}
