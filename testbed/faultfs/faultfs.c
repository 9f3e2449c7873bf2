/*
 * faultfs: a passthrough FUSE filesystem over a backing directory that holds every byte
 * written to a file in its own memory until that file is fsync'ed or fdatasync'ed, as a
 * disk's volatile cache does. Readers see the unsynced bytes and the size they make; an
 * fsync (on any descriptor of the file) writes them into the backing file and syncs it.
 * Closing a file does not make its data durable.
 *
 * A power cut is SIGKILL of this daemon and a lazy unmount: what was not synced is gone;
 * mounting the same backing directory again shows only what was. `kill -9` of a program
 * alone cannot show a missing fsync: the kernel's page cache outlives the program.
 *
 *   faultfs <backing-dir> <mountpoint> [-o fuse-options]
 *
 * Runs in the foreground, single-threaded (every operation in turn: no locks), and prints
 * "faultfs: ready" once the kernel has initialised the mount. It implements what nats-server
 * and the tests use: files and directories, no links, locks or fallocate.
 *
 * Metadata is treated as synced: create, mkdir, rename, unlink, rmdir, truncate and chmod
 * go straight to the backing directory. That is lenient in one direction only (a cut can
 * keep a name that a real disk might lose, never lose one it would keep), and it matches
 * what the drills rely on: ext4 and xfs commit a file's pending name changes to their
 * journal when the file is fsync'ed, so after fsync(file) its name is durable there too.
 * Data is what an application forgets to sync, and data is what this layer drops.
 *
 * Unsynced data lives in 4 KiB pages per inode (not per descriptor), so two descriptors of
 * one file see each other's writes and an fsync on either makes both durable. A page is
 * copied from the backing file when first written (read-modify-write), so a write over
 * part of a synced page keeps the rest, and after a cut the old bytes come back. Inodes
 * are the backing file's (the backing directory is one filesystem), so unsynced data
 * follows its file through a rename.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define PAGE 4096

/* The unsynced state of one file: it exists only while the file has unsynced pages. */
struct node {
	ino_t ino;
	off_t size;        /* the size readers see (the backing file's may be smaller) */
	char **pages;      /* pages[i]: content of page i not yet in the backing file, or NULL */
	size_t npages;     /* length of pages[] */
	size_t dirty;      /* non-NULL entries of pages[] */
	struct node *next;
};

/* One open descriptor: the backing file, opened read-write whatever the caller asked. */
struct handle {
	int fd;
	ino_t ino;
	int sync;          /* opened O_SYNC / O_DSYNC: every write is durable before it returns */
};

static int base = -1;          /* the backing directory */
static struct node *nodes;     /* few files are dirty at once: a list will do */

/* A FUSE path ("/a/b") relative to the backing directory. */
static const char *rel(const char *path)
{
	return path[1] ? path + 1 : ".";
}

static struct handle *handle_of(struct fuse_file_info *fi)
{
	return (struct handle *)(uintptr_t)fi->fh;
}

static struct node *node_find(ino_t ino)
{
	for (struct node *n = nodes; n; n = n->next)
		if (n->ino == ino)
			return n;
	return NULL;
}

static void node_drop(ino_t ino)
{
	for (struct node **p = &nodes; *p; p = &(*p)->next) {
		if ((*p)->ino != ino)
			continue;
		struct node *n = *p;
		*p = n->next;
		for (size_t i = 0; i < n->npages; i++)
			free(n->pages[i]);
		free(n->pages);
		free(n);
		return;
	}
}

/* The node of the file behind `fd`, created (size from the backing file) if it had none. */
static struct node *node_get(ino_t ino, int fd)
{
	struct node *n = node_find(ino);
	if (n)
		return n;
	struct stat st;
	if (fstat(fd, &st) == -1 || !(n = calloc(1, sizeof(*n))))
		return NULL;
	n->ino = ino;
	n->size = st.st_size;
	n->next = nodes;
	nodes = n;
	return n;
}

/* Page `i` of the node, filled from the backing file (zeros past its end) when first taken. */
static char *page_get(struct node *n, int fd, size_t i)
{
	if (i >= n->npages) {
		size_t len = n->npages ? n->npages : 16;
		while (len <= i)
			len *= 2;
		char **pages = realloc(n->pages, len * sizeof(*pages));
		if (!pages)
			return NULL;
		memset(pages + n->npages, 0, (len - n->npages) * sizeof(*pages));
		n->pages = pages;
		n->npages = len;
	}
	if (!n->pages[i]) {
		char *p = calloc(1, PAGE);
		if (!p)
			return NULL;
		if (pread(fd, p, PAGE, (off_t)i * PAGE) == -1) {
			free(p);
			return NULL;
		}
		n->pages[i] = p;
		n->dirty++;
	}
	return n->pages[i];
}

/* The node's size becomes `size`: pages past it are dropped, the tail of the last one zeroed. */
static void node_truncate(ino_t ino, off_t size)
{
	struct node *n = node_find(ino);
	if (!n)
		return;
	for (size_t i = 0; i < n->npages; i++) {
		off_t start = (off_t)i * PAGE;
		if (!n->pages[i] || start + PAGE <= size)
			continue;
		if (start >= size) {
			free(n->pages[i]);
			n->pages[i] = NULL;
			n->dirty--;
		} else {
			memset(n->pages[i] + (size - start), 0, PAGE - (size - start));
		}
	}
	n->size = size;
	if (!n->dirty)
		node_drop(ino);
}

/* fsync: the unsynced pages into the backing file, then its own fsync; the node is then clean. */
static int node_sync(ino_t ino, int fd, int datasync)
{
	struct node *n = node_find(ino);
	if (n) {
		for (size_t i = 0; i < n->npages; i++) {
			off_t start = (off_t)i * PAGE;
			if (!n->pages[i] || start >= n->size)
				continue;
			size_t len = n->size - start < PAGE ? (size_t)(n->size - start) : PAGE;
			if (pwrite(fd, n->pages[i], len, start) != (ssize_t)len)
				return -EIO; /* the node stays: nothing was promised */
		}
		node_drop(ino);
	}
	return (datasync ? fdatasync(fd) : fsync(fd)) == -1 ? -errno : 0;
}

static void *ff_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	/* Every write reaches us as it is made (no kernel write-back cache in front of ours). */
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	cfg->use_ino = 1;
	/* The default: unlink of an open file renames it to .fuse_hidden* until its last close,
	 * so every unlink and rename-over we see is of a file nobody has open. */
	cfg->hard_remove = 0;
	printf("faultfs: ready\n");
	fflush(stdout);
	return NULL;
}

static int ff_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	int r = fi ? fstat(handle_of(fi)->fd, st) : fstatat(base, rel(path), st, AT_SYMLINK_NOFOLLOW);
	if (r == -1)
		return -errno;
	struct node *n = S_ISREG(st->st_mode) ? node_find(st->st_ino) : NULL;
	if (n) {
		st->st_size = n->size;
		st->st_blocks = (n->size + 511) / 512;
	}
	return 0;
}

static int ff_open_common(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	/* Read-write for the read-modify-write of pages; no O_APPEND (the kernel gives offsets,
	 * and pwrite on an O_APPEND descriptor would append) nor O_DIRECT (our buffers are not
	 * aligned); O_SYNC is kept as a flag. */
	int flags = (fi->flags & ~(O_ACCMODE | O_APPEND | O_DIRECT | O_SYNC | O_DSYNC)) | O_RDWR;
	int fd = openat(base, rel(path), flags, mode);
	if (fd == -1)
		return -errno;
	struct stat st;
	struct handle *h = malloc(sizeof(*h));
	if (!h || fstat(fd, &st) == -1) {
		free(h);
		close(fd);
		return -EIO;
	}
	h->fd = fd;
	h->ino = st.st_ino;
	h->sync = (fi->flags & (O_SYNC | O_DSYNC)) != 0;
	if (fi->flags & O_TRUNC)
		node_truncate(h->ino, 0);
	fi->fh = (uintptr_t)h;
	return 0;
}

static int ff_open(const char *path, struct fuse_file_info *fi)
{
	return ff_open_common(path, 0, fi);
}

static int ff_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	fi->flags |= O_CREAT;
	return ff_open_common(path, mode, fi);
}

static int ff_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	struct handle *h = handle_of(fi);
	struct node *n = node_find(h->ino);
	if (!n) {
		ssize_t r = pread(h->fd, buf, size, off);
		return r == -1 ? -errno : (int)r;
	}
	if (off >= n->size)
		return 0;
	if ((off_t)size > n->size - off)
		size = n->size - off;
	/* Page by page: unsynced pages from memory, the rest from the backing file (zeros past its end). */
	for (size_t done = 0; done < size;) {
		off_t at = off + done;
		size_t i = at / PAGE, in = at % PAGE;
		size_t len = PAGE - in < size - done ? PAGE - in : size - done;
		if (i < n->npages && n->pages[i]) {
			memcpy(buf + done, n->pages[i] + in, len);
		} else {
			ssize_t r = pread(h->fd, buf + done, len, at);
			if (r == -1)
				return -errno;
			memset(buf + done + r, 0, len - r);
		}
		done += len;
	}
	return (int)size;
}

static int ff_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	struct handle *h = handle_of(fi);
	struct node *n = node_get(h->ino, h->fd);
	if (!n)
		return -ENOMEM;
	for (size_t done = 0; done < size;) {
		off_t at = off + done;
		size_t in = at % PAGE;
		size_t len = PAGE - in < size - done ? PAGE - in : size - done;
		char *p = page_get(n, h->fd, at / PAGE);
		if (!p)
			return -ENOMEM;
		memcpy(p + in, buf + done, len);
		done += len;
	}
	if (off + (off_t)size > n->size)
		n->size = off + size;
	if (h->sync) {
		int r = node_sync(h->ino, h->fd, 1);
		if (r)
			return r;
	}
	return (int)size;
}

static int ff_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	int fd = fi ? handle_of(fi)->fd : openat(base, rel(path), O_WRONLY);
	if (fd == -1)
		return -errno;
	struct stat st;
	int r = fstat(fd, &st) == -1 || ftruncate(fd, size) == -1 ? -errno : 0;
	if (!r)
		node_truncate(st.st_ino, size);
	if (!fi)
		close(fd);
	return r;
}

/* close(2): nothing becomes durable (a real disk keeps closed files' data in its cache too). */
static int ff_flush(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	(void)fi;
	return 0;
}

static int ff_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	struct handle *h = handle_of(fi);
	close(h->fd);
	free(h);
	return 0;
}

static int ff_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path;
	struct handle *h = handle_of(fi);
	return node_sync(h->ino, h->fd, datasync);
}

/* Directories' entries are already in the backing directory (metadata is treated as synced). */
static int ff_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path;
	(void)datasync;
	(void)fi;
	return 0;
}

static int ff_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags)
{
	(void)off;
	(void)fi;
	(void)flags;
	int fd = openat(base, rel(path), O_RDONLY | O_DIRECTORY);
	DIR *d = fd == -1 ? NULL : fdopendir(fd);
	if (!d) {
		int e = errno;
		if (fd != -1)
			close(fd);
		return -e;
	}
	for (struct dirent *e; (e = readdir(d));)
		if (fill(buf, e->d_name, NULL, 0, 0))
			break;
	closedir(d);
	return 0;
}

static int ff_mkdir(const char *path, mode_t mode)
{
	return mkdirat(base, rel(path), mode) == -1 ? -errno : 0;
}

static int ff_rmdir(const char *path)
{
	return unlinkat(base, rel(path), AT_REMOVEDIR) == -1 ? -errno : 0;
}

static int ff_unlink(const char *path)
{
	struct stat st;
	int last = fstatat(base, rel(path), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1;
	if (unlinkat(base, rel(path), 0) == -1)
		return -errno;
	if (last)
		node_drop(st.st_ino);
	return 0;
}

static int ff_rename(const char *from, const char *to, unsigned int flags)
{
	if (flags)
		return -EINVAL;
	struct stat st;
	int replaces = fstatat(base, rel(to), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1;
	if (renameat(base, rel(from), base, rel(to)) == -1)
		return -errno;
	if (replaces)
		node_drop(st.st_ino);
	return 0;
}

static int ff_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	int r = fi ? fchmod(handle_of(fi)->fd, mode) : fchmodat(base, rel(path), mode, 0);
	return r == -1 ? -errno : 0;
}

static int ff_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	int r = fi ? fchown(handle_of(fi)->fd, uid, gid) : fchownat(base, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW);
	return r == -1 ? -errno : 0;
}

static int ff_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	int r = fi ? futimens(handle_of(fi)->fd, tv) : utimensat(base, rel(path), tv, AT_SYMLINK_NOFOLLOW);
	return r == -1 ? -errno : 0;
}

static int ff_access(const char *path, int mask)
{
	return faccessat(base, rel(path), mask, 0) == -1 ? -errno : 0;
}

static int ff_statfs(const char *path, struct statvfs *st)
{
	(void)path;
	return fstatvfs(base, st) == -1 ? -errno : 0;
}

static const struct fuse_operations ops = {
	.init = ff_init,
	.getattr = ff_getattr,
	.open = ff_open,
	.create = ff_create,
	.read = ff_read,
	.write = ff_write,
	.truncate = ff_truncate,
	.flush = ff_flush,
	.release = ff_release,
	.fsync = ff_fsync,
	.fsyncdir = ff_fsyncdir,
	.readdir = ff_readdir,
	.mkdir = ff_mkdir,
	.rmdir = ff_rmdir,
	.unlink = ff_unlink,
	.rename = ff_rename,
	.chmod = ff_chmod,
	.chown = ff_chown,
	.utimens = ff_utimens,
	.access = ff_access,
	.statfs = ff_statfs,
};

int main(int argc, char *argv[])
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s <backing-dir> <mountpoint> [-o fuse-options]\n", argv[0]);
		return 2;
	}
	base = open(argv[1], O_RDONLY | O_DIRECTORY);
	if (base == -1) {
		perror(argv[1]);
		return 1;
	}
	/* fuse_main's own arguments: the mountpoint and options, in the foreground, one thread. */
	char *args[argc + 3];
	int n = 0;
	args[n++] = argv[0];
	args[n++] = "-f";
	args[n++] = "-s";
	for (int i = 2; i < argc; i++)
		args[n++] = argv[i];
	args[n] = NULL;
	return fuse_main(n, args, &ops, NULL);
}
