#!/bin/sh
echo "app says: $APP_MODE $(cat /app/build.txt)"
