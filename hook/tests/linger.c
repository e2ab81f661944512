/* linger.c - preloaded after libvgpu by test_multiproc's lingering-exit mode: a library whose
 * destructor runs after libvgpu's (LD_PRELOAD's later entries are finalised later) and keeps the
 * exiting process, and with it the GPU memory it never freed, alive: it writes a byte to fd
 * LINGER_FD, then waits for that fd's peer to say go (a byte, or the end, on LINGER_GO). */
#include <stdlib.h>
#include <unistd.h>

__attribute__((destructor)) static void linger(void)
{
    const char *said = getenv("LINGER_FD");
    const char *go = getenv("LINGER_GO");
    if (said == NULL || go == NULL)
        return;
    char byte = 'l';
    if (write(atoi(said), &byte, 1) == 1)
        (void)read(atoi(go), &byte, 1);
}
