// Two busy threads doing what a service does per request: parse a line of numbers, hash them
// (SHA-256, 201 rounds) and sort a derived array. For the agent's benchmarks on a JVM target
// (tests/bench/agent/language_cost.sh, case java): java JavaWorkload SECONDS.
import java.util.*;
import java.security.MessageDigest;

public class JavaWorkload {
  // -Dslow=true: parse() splits with a regular expression (a slower release of the same work).
  static final boolean SLOW = Boolean.parseBoolean(System.getProperty("slow", "false"));
  static long sink;

  static int[] parse(String line) {
    if (SLOW) {
      String[] parts = line.split("[,;]");
      int[] out = new int[parts.length];
      for (int i = 0; i < parts.length; i++) out[i] = Integer.parseInt(parts[i].trim());
      return out;
    }
    int[] out = new int[64];
    int n = 0, v = 0;
    for (int i = 0; i < line.length(); i++) {
      char c = line.charAt(i);
      if (c == ',' || c == ';') { out[n++] = v; v = 0; } else if (c != ' ') v = v * 10 + (c - '0');
    }
    out[n++] = v;
    return Arrays.copyOf(out, n);
  }

  static byte[] hash(int[] values) throws Exception {
    MessageDigest md = MessageDigest.getInstance("SHA-256");
    for (int v : values) md.update((byte) v);
    byte[] d = md.digest();
    for (int i = 0; i < 200; i++) d = md.digest(d);
    return d;
  }

  static long sortWork(int[] values) {
    int[] copy = Arrays.copyOf(values, values.length * 8);
    for (int i = values.length; i < copy.length; i++) copy[i] = copy[i - values.length] * 31 + i;
    Arrays.sort(copy);
    return copy[copy.length / 2];
  }

  static void handle(String line) throws Exception {
    int[] v = parse(line);
    byte[] h = hash(v);
    sink += h[0] + sortWork(v);
  }

  public static void main(String[] args) throws Exception {
    double seconds = Double.parseDouble(args[0]);
    StringBuilder sb = new StringBuilder();
    for (int i = 0; i < 48; i++) { if (i > 0) sb.append(i % 5 == 0 ? "; " : ","); sb.append(i * 7919 % 100000); }
    String line = sb.toString();
    Thread[] workers = new Thread[2];
    long end = System.nanoTime() + (long) (seconds * 1e9);
    for (int t = 0; t < workers.length; t++) {
      workers[t] = new Thread(() -> {
        try { while (System.nanoTime() < end) handle(line); } catch (Exception e) { throw new RuntimeException(e); }
      }, "worker-" + t);
      workers[t].start();
    }
    System.out.println("ready " + ProcessHandle.current().pid());
    for (Thread w : workers) w.join();
    System.out.println("done " + sink);
  }
}
