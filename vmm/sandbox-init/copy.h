/* copy.h — fork: the source sandbox's /work copied file by file into a new
 * sandbox's disk and moved into the new sandbox's uid range.
 *
 * It runs as host root while the source sandbox runs and may change its
 * /work meanwhile, so it never resolves a path string of the source's tree:
 * every entry is opened by its one name beneath its parent's descriptor
 * (beneath.h), a link is copied as a link and never followed, device nodes
 * and sockets are skipped, and the copy is bounded by the new disk (copy.c
 * says why it is not done inside the source's namespaces). What goes back
 * to the caller on failure is a fixed sentence: nothing of the host. */
#pragma once

#include <stdint.h>

/* Copies the /work of the sandbox whose init is from_pid (trusted only while
 * that process is in from_id's cgroup) into workfd (the new disk's root),
 * within disk_bytes; ids outside the source's range become base. Fails (the
 * init ends) if the source cannot be found or its files do not fit. */
void copy_disk(int workfd, uint64_t disk_bytes, const char *from_pid, const char *from_id, uint32_t base);
