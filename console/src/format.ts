/** Numbers for people: bytes, durations, ages. */

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value >= 100 || unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
}

export function duration(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "–";
  const s = Math.max(0, ms) / 1000;
  if (s < 1) return `${Math.round(ms)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.floor(s % 60)} s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

export function age(createdAtUnix: number, now: number): string {
  return duration(now - createdAtUnix * 1000);
}

/** Remaining lifetime. */
export function remaining(expiresAtMs: number | null, now: number): string {
  if (expiresAtMs === null) return "no limit";
  const left = expiresAtMs - now;
  return left <= 0 ? "expiring" : `${duration(left)} left`;
}

export function percent(p: number | null | undefined): string {
  if (p === null || p === undefined || !Number.isFinite(p)) return "–";
  return `${p.toFixed(p < 10 ? 1 : 0)} %`;
}

/** An age to the minute (the tree re-renders its rows once a minute, not every second). */
export function ageCoarse(createdAtUnix: number, now: number): string {
  const minutes = Math.floor((now - createdAtUnix * 1000) / 60_000);
  if (minutes < 1) return "< 1 min";
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h ${minutes % 60} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}
