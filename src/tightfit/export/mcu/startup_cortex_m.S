/* tightfit: startup for a bare-metal Cortex-M (ARMv7E-M) with a hard-float FPU.
 *
 * The vector table sits at the start of FLASH, where the core reads its initial
 * stack pointer and reset address (VTOR is 0 out of reset). Reset_Handler is
 * written in assembly because it must enable the FPU before any C code runs:
 * code built with -mfloat-abi=hard may touch VFP registers anywhere, and an FPU
 * access while CP10/CP11 are disabled is a UsageFault.
 *
 * The stack lies at the bottom of RAM (see the linker script), so an overflow
 * runs off the start of RAM instead of silently overwriting .data or the arena.
 * Reset_Handler paints the stack with TF_STACK_PAINT so that tf_finish can
 * report the deepest stack the run used.
 */
    .file "startup_cortex_m.S"  /* else the symbol table names a random temporary: builds would differ */
    .syntax unified
    .thumb

    .equ CPACR, 0xE000ED88
    .equ TF_STACK_PAINT, 0x5A5AA5A5

    .section .vectors, "a", %progbits
    .align 2
    .globl tf_vectors
tf_vectors:
    .word __stack_top        /* initial SP */
    .word Reset_Handler
    .word tf_fault_handler   /* NMI */
    .word tf_fault_handler   /* HardFault */
    .word tf_fault_handler   /* MemManage */
    .word tf_fault_handler   /* BusFault */
    .word tf_fault_handler   /* UsageFault */
    .word 0, 0, 0, 0         /* reserved */
    .word tf_fault_handler   /* SVCall */
    .word tf_fault_handler   /* DebugMonitor */
    .word 0                  /* reserved */
    .word tf_fault_handler   /* PendSV */
    .word tf_systick_handler /* SysTick: counts the wraps of tf_count_start's timer */
    /* No external interrupt is enabled, so the table ends with the system exceptions. */

    .section .text.Reset_Handler, "ax", %progbits
    .align 2
    .globl Reset_Handler
    .type Reset_Handler, %function
    .thumb_func
Reset_Handler:
    /* CP10 and CP11 full access: the FPU. */
    ldr   r0, =CPACR
    ldr   r1, [r0]
    orr   r1, r1, #(0xF << 20)
    str   r1, [r0]
    dsb
    isb

    /* .data: initial values from FLASH to RAM. */
    ldr   r0, =__data_start
    ldr   r1, =__data_end
    ldr   r2, =__data_load
1:  cmp   r0, r1
    bhs   2f
    ldr   r3, [r2], #4
    str   r3, [r0], #4
    b     1b

    /* .bss (the arena included): zero. */
2:  ldr   r0, =__bss_start
    ldr   r1, =__bss_end
    movs  r3, #0
3:  cmp   r0, r1
    bhs   4f
    str   r3, [r0], #4
    b     3b

    /* Paint the whole stack; nothing has been pushed yet. */
4:  ldr   r0, =__stack_bottom
    ldr   r1, =__stack_top
    ldr   r3, =TF_STACK_PAINT
5:  cmp   r0, r1
    bhs   6f
    str   r3, [r0], #4
    b     5b

6:  bl    main
    bl    tf_finish          /* reports the stack depth, exits through semihosting */
7:  b     7b
    .size Reset_Handler, . - Reset_Handler

    .pool
