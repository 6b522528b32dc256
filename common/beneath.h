/* beneath.h — file work as host root inside a folder that a sandbox (or a
 * jailed QEMU) can write: a sandbox's disk, the folders tally-vmm keeps for it.
 *
 * Everything here goes one name at a time, relative to a directory
 * descriptor already held, with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
 * | RESOLVE_NO_XDEV) or the *at() calls that never follow a last link: a link
 * the other party planted is never followed, a rename it makes meanwhile can
 * only move what is walked within the tree, and a walk never crosses into
 * another file system. No path string inside the tree is ever resolved twice.
 *
 * Only plain system calls and no allocation beyond a directory stream:
 * tally-sandbox-init (a program of its own) links this file too. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

/* How deep a walk goes: each level holds two descriptors. */
#define BENEATH_DEPTH_MAX 256

/* Opens name, one component (no '/'), beneath the directory dirfd: never a
 * link (ELOOP), never another file system (EXDEV), never "..". flags as for
 * openat (O_NOFOLLOW and O_CLOEXEC are added); mode with O_CREAT. Returns the
 * descriptor or -errno. */
int beneath_open(int dirfd, const char *name, int flags, mode_t mode);

/* Removes path (a folder, or a file or link) and everything beneath it,
 * without following a link or leaving path's file system (a mount inside is
 * left alone, and so is the folder holding it). path itself is opened
 * without following a link. Returns 0, or the first error as -errno (it goes
 * on with the rest); -ENOENT when path is not there. */
int beneath_remove_tree(const char *path);

/* Bytes of storage path uses: its blocks if it is a file; the blocks of every
 * file beneath it (links not followed, other file systems not entered, each
 * file counted once however many names it has) if it is a folder; 0 for
 * anything else or nothing. */
uint64_t beneath_usage(const char *path);

/* Gives path (a socket or folder a jailed process will use) to uid:gid with
 * mode, without following a link in its place: the change lands on the file
 * opened, never on what a link planted there names. Returns 0 or -errno
 * (-ELOOP for a link). */
int beneath_give(const char *path, uid_t uid, gid_t gid, mode_t mode);
