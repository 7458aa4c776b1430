/* nfq_delay: adds a fixed one-way delay to the packets of one netfilter queue.
 *
 * The kernel of the emulated cluster has no netem qdisc, so latency is added in user space: an
 * iptables rule in a host's network namespace hands every packet leaving eth0 to NFQUEUE number
 * Q, and this program (run in the same namespace) accepts each packet DELAY_US microseconds after
 * it arrived, in arrival order. Packets are never reordered or dropped; if the ring of pending
 * packets is full a packet passes at once. The wait for the oldest pending packet is a ppoll
 * with a nanosecond timeout: no spinning, so it can run under SCHED_FIFO without starving the
 * host's processes.
 *
 *   nfq_delay QUEUE DELAY_US
 *
 * Build: cc -O2 -o nfq_delay nfq_delay.c -lnetfilter_queue -lnfnetlink
 * Exits on SIGTERM/SIGINT after accepting what it holds (the queue is created with fail-open and
 * the rule with --queue-bypass, so traffic flows on without it). */
#define _GNU_SOURCE
#include <arpa/inet.h> /* before linux/netfilter.h */
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define RING (1u << 20)

static uint32_t ring_id[RING];
static uint64_t ring_due[RING];
static uint64_t head, tail; /* pending packets are ring[head..tail) */
static uint64_t delay_ns;
static volatile sig_atomic_t stop;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int on_packet(struct nfq_q_handle* q, struct nfgenmsg* msg, struct nfq_data* d, void* arg) {
  (void)msg;
  (void)arg;
  struct nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(d);
  if (ph == NULL) return 0;
  uint32_t id = ntohl(ph->packet_id);
  if (tail - head >= RING) return nfq_set_verdict(q, id, NF_ACCEPT, 0, NULL);
  ring_id[tail % RING] = id;
  ring_due[tail % RING] = now_ns() + delay_ns;
  tail++;
  return 0;
}

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s QUEUE DELAY_US\n", argv[0]);
    return 2;
  }
  int queue = atoi(argv[1]);
  delay_ns = strtoull(argv[2], NULL, 10) * 1000ull;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  struct nfq_handle* h = nfq_open();
  if (h == NULL) {
    perror("nfq_delay: nfq_open");
    return 1;
  }
  struct nfq_q_handle* q = nfq_create_queue(h, (uint16_t)queue, &on_packet, NULL);
  if (q == NULL) {
    perror("nfq_delay: nfq_create_queue");
    return 1;
  }
  nfq_set_mode(q, NFQNL_COPY_META, 0);
  nfq_set_queue_maxlen(q, 200000);
  nfq_set_queue_flags(q, NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN);
  nfnl_rcvbufsiz(nfq_nfnlh(h), 64 << 20);
  int fd = nfq_fd(h);
  static char buf[1 << 16];
  while (!stop) {
    struct timespec wait, *timeout = NULL;
    if (head != tail) {
      uint64_t n = now_ns(), due = ring_due[head % RING], w = due > n ? due - n : 0;
      wait.tv_sec = (time_t)(w / 1000000000ull);
      wait.tv_nsec = (long)(w % 1000000000ull);
      timeout = &wait;
    }
    struct pollfd p = {fd, POLLIN, 0};
    int r = ppoll(&p, 1, timeout, NULL);
    if (r < 0 && errno != EINTR) {
      perror("nfq_delay: ppoll");
      break;
    }
    if (r > 0) {
      for (;;) {
        int n = (int)recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0) break;
        nfq_handle_packet(h, buf, n);
      }
    }
    uint64_t n = now_ns();
    while (head != tail && ring_due[head % RING] <= n) {
      nfq_set_verdict(q, ring_id[head % RING], NF_ACCEPT, 0, NULL);
      head++;
    }
  }
  while (head != tail) nfq_set_verdict(q, ring_id[head++ % RING], NF_ACCEPT, 0, NULL);
  nfq_destroy_queue(q);
  nfq_close(h);
  return 0;
}
