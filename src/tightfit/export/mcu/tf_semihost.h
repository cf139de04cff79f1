/* tightfit: the few ARM semihosting calls the microcontroller test program needs.
 * Semihosting lets a program under a debugger or an emulator (qemu's
 * -semihosting) open host files and exit with a status, without newlib's
 * rdimon stdio and the heap its FILE buffers need. */
#ifndef TF_SEMIHOST_H
#define TF_SEMIHOST_H

#include <stddef.h>

/* Host files by descriptor: negative (and a message on the console) on failure. */
int tf_open_read(const char *path);
int tf_open_write(const char *path);
/* Exactly n bytes from byte `offset` of the file into dst; 0 on success. */
int tf_read_at(int fd, size_t offset, void *dst, size_t n);
/* All n bytes; 0 on success. */
int tf_write(int fd, const void *src, size_t n);
int tf_close(int fd);
/* Fill dst with exactly n bytes of the host file at path; 0 on success. */
int tf_read_file(const char *path, void *dst, size_t n);
/* Write n bytes to the host file at path (created or truncated); 0 on success. */
int tf_write_file(const char *path, const void *src, size_t n);
/* A line on the host's console. */
void tf_print(const char *text);
/* End the emulation with this status (qemu exits with it). */
void tf_exit(int status) __attribute__((noreturn));
/* Called by Reset_Handler with main's status: checks and reports the stack, then exits. */
void tf_finish(int status) __attribute__((noreturn));
/* Count the core clock with SysTick from tf_count_start to tf_count_stop, which prints
 * "tightfit-mcu: <what> took <N> core clock cycles". Under qemu -icount the board's clock
 * follows the instructions executed, so N stands for an instruction count. */
void tf_count_start(void);
void tf_count_stop(const char *what);
void tf_systick_handler(void);
/* Any fault or unexpected exception: one line, then exit with status 3. */
void tf_fault_handler(void);

#endif
